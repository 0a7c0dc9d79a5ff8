"""Verdict helpers for the reliability checks: growth over a soak, and invariants of one request."""

from __future__ import annotations

from dataclasses import dataclass, field

from conformance.verdicts.verdict import FigureLimit, Verdict


@dataclass
class SoakReport(Verdict):
    samples: list[dict[str, float]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    judged_by: dict[str, FigureLimit] = field(default_factory=dict)

    def limits(self) -> dict[str, FigureLimit]:
        return dict(self.judged_by)

    def figures(self) -> dict[str, float]:
        if not self.samples:
            return {}
        first, last = self.samples[0], self.samples[-1]
        figs = {"rss_growth_mib": last["rss_mib"] - first["rss_mib"], "fd_growth": last["open_fds"] - first["open_fds"],
                "max_kv_used_after_round": max(s["kv_used"] for s in self.samples), "rounds": float(len(self.samples))}
        if all("vram_mib" in s for s in self.samples):
            figs["vram_growth_mib"] = last["vram_mib"] - first["vram_mib"]
        return figs


def soak_verdict(samples: list[dict[str, float]], warmup: int, max_rss_mib: float, max_fds: float,
                 max_vram_mib: float | None = None) -> SoakReport:
    """samples: one per round after its requests finished: rss_mib, open_fds, kv_used (and vram_mib on a GPU,
    judged when `max_vram_mib` is given: a GPU soak that cannot read VRAM fails closed)."""
    soak = "targets.toml soak"
    report = SoakReport(samples[warmup:], judged_by={
        "rss_growth_mib": FigureLimit(max_rss_mib, "max", f"{soak} max_rss_growth_mib", headroom=False),
        "fd_growth": FigureLimit(max_fds, "max", f"{soak} max_fd_growth", headroom=False),
        "max_kv_used_after_round": FigureLimit(0.0, "max", "every block free after each round", headroom=False)})
    if max_vram_mib is not None:
        report.judged_by["vram_growth_mib"] = FigureLimit(max_vram_mib, "max", f"{soak} max_vram_growth_mib",
                                                          headroom=False)
    if len(report.samples) < 2:
        report.problems.append(f"only {len(report.samples)} rounds after warm-up: nothing to compare")
        return report
    figs = report.figures()
    if figs["rss_growth_mib"] > max_rss_mib:
        report.problems.append(f"engine RSS grew {figs['rss_growth_mib']:.0f} MiB over {len(report.samples)} rounds "
                               f"(bound {max_rss_mib:.0f})")
    if figs["fd_growth"] > max_fds:
        report.problems.append(f"open file descriptors grew by {figs['fd_growth']:.0f} (bound {max_fds:.0f})")
    if max_vram_mib is not None:
        if "vram_growth_mib" not in figs:
            report.problems.append("the engine reported no VRAM use (vram_mib): device memory growth not measured")
        elif figs["vram_growth_mib"] > max_vram_mib:
            report.problems.append(f"engine VRAM grew {figs['vram_growth_mib']:.0f} MiB over {len(report.samples)} "
                                   f"rounds (bound {max_vram_mib:.0f})")
    leaked = [i for i, s in enumerate(report.samples) if s["kv_used"] > 0]
    if leaked:
        report.problems.append(f"KV blocks still in use after rounds {leaked[:5]}")
    return report


def output_problems(out: dict, prompt_len: int, params: dict, vocab: int, max_model_len: int) -> list[str]:
    """Invariants of one finished request, whatever the sampling parameters."""
    problems = []
    ids = out["token_ids"]
    limit = min(params["max_tokens"], max_model_len - prompt_len)
    if len(ids) > limit:
        problems.append(f"{len(ids)} tokens generated, more than max_tokens {params['max_tokens']}")
    if any(not 0 <= t < vocab for t in ids):
        problems.append("a token id outside the vocabulary")
    stops = set(params.get("stop_token_ids") or [])
    if stops and any(t in stops for t in ids[:-1]):
        problems.append("generation went on past a stop token")
    if out["finish_reason"] not in ("stop", "length"):
        problems.append(f"finish_reason {out['finish_reason']!r}")
    if out["finish_reason"] == "length" and len(ids) != limit:
        problems.append(f"finished for length with {len(ids)} of {limit} tokens")
    return problems


def killed_stream_problems(events: list[bytes], seconds: float, limit_s: float) -> list[str]:
    """A stream whose server was killed after its third event must end, soon, without [DONE]."""
    problems = []
    if len(events) < 3:
        problems.append("the stream never got under way")
    elif events[-1] == b"data: [DONE]":
        problems.append("the stream ended with [DONE] although the server was killed mid-stream")
    if not seconds < limit_s:
        problems.append(f"the client noticed the dead server only after {seconds:.0f} s (limit {limit_s:.0f})")
    return problems
