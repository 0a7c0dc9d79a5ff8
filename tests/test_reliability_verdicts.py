"""Negative controls of the P3 reliability verdicts: growth, leaks and malformed outputs fail."""

from __future__ import annotations

from conformance.verdicts import reliability


def rounds(rss: list[float], fds: list[float] | None = None, kv: list[float] | None = None) -> list[dict]:
    n = len(rss)
    fds, kv = fds or [10.0] * n, kv or [0.0] * n
    return [{"rss_mib": r, "open_fds": f, "kv_used": k} for r, f, k in zip(rss, fds, kv)]


def test_flat_soak_passes():
    assert not reliability.soak_verdict(rounds([500, 900, 1000, 1001, 1000, 1002]), 2, 64, 4).problems


def test_rss_growth_fails():
    report = reliability.soak_verdict(rounds([500, 900, 1000, 1100, 1200, 1300]), 2, 64, 4)
    assert report.problems and "RSS grew" in report.problems[0]


def test_fd_leak_and_kv_leak_fail():
    assert reliability.soak_verdict(rounds([1000] * 6, fds=[10, 10, 10, 12, 16, 20]), 2, 64, 4).problems
    assert reliability.soak_verdict(rounds([1000] * 6, kv=[0, 0, 0, 0, 3, 0]), 2, 64, 4).problems


def test_too_few_rounds_fail_closed():
    assert reliability.soak_verdict(rounds([1000, 1000]), 2, 64, 4).problems


PARAMS = {"max_tokens": 4, "stop_token_ids": [7]}


def test_well_formed_outputs_pass():
    full = {"token_ids": [1, 2, 3, 4], "finish_reason": "length"}
    assert not reliability.output_problems(full, 10, PARAMS, 100, 1024)
    assert not reliability.output_problems({"token_ids": [1, 7], "finish_reason": "stop"}, 10, PARAMS, 100, 1024)


def test_malformed_outputs_fail():
    def bad(out: dict) -> bool:
        return bool(reliability.output_problems(out, 10, PARAMS, 100, 1024))

    assert bad({"token_ids": [1, 2, 3, 4, 5], "finish_reason": "length"})  # beyond max_tokens
    assert bad({"token_ids": [1, 200], "finish_reason": "stop"})  # out of vocab
    assert bad({"token_ids": [7, 1, 2], "finish_reason": "length"})  # went past a stop token
    assert bad({"token_ids": [1, 2], "finish_reason": "abort"})
    assert bad({"token_ids": [1, 2], "finish_reason": "length"})  # length finish with fewer tokens


def test_killed_stream_verdict():
    under_way = [b"data: {}"] * 3
    assert not reliability.killed_stream_problems(under_way, 0.3, 30)
    assert reliability.killed_stream_problems(under_way + [b"data: [DONE]"], 0.3, 30)  # a "complete" reply
    assert reliability.killed_stream_problems(under_way, 31, 30)  # the client hung
    assert reliability.killed_stream_problems([], 0.1, 30)  # never started


def test_vram_growth_fails_on_a_gpu_soak_and_unread_vram_fails_closed():
    samples = [s | {"vram_mib": v} for s, v in zip(rounds([1000] * 6), [900, 2000, 2100, 2400, 2700, 3000])]
    report = reliability.soak_verdict(samples, 2, 64, 4, max_vram_mib=256)
    assert report.problems == ["engine VRAM grew 900 MiB over 4 rounds (bound 256)"]
    assert report.figures()["vram_growth_mib"] == 900
    assert not reliability.soak_verdict(samples, 2, 64, 4).problems  # the CPU target passes no VRAM bound
    blind = reliability.soak_verdict(rounds([1000] * 6), 2, 64, 4, max_vram_mib=256)
    assert blind.problems and "reported no VRAM use" in blind.problems[0]
