"""The fp64 reference's result cache (conformance/reference/cache.py): a hit is the computed result exactly, and
nothing but the same checkpoint, call and variant can hit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conformance.engines.base import Completion, StepLogprobs
from conformance.reference import cache
from conformance.reference.gpt_oss import Reference
from conformance.reference.longref import LongReference


@pytest.fixture
def cached(tmp_path: Path):
    cache.enable(tmp_path / "results")
    yield tmp_path / "results"
    cache.disable()


def entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*.json"))


def test_off_unless_a_run_turns_it_on(tiny, tmp_path: Path):
    assert not cache.enabled()
    hits = cache.counts.hits  # whatever earlier tests left: the counts reset when a run enables the cache
    Reference(tiny.path).score([1, 2, 3], [4], 3)
    assert cache.counts.hits == hits and not list(tmp_path.rglob("*.json"))


def test_a_hit_is_exactly_the_computed_result(tiny, cached: Path):
    ref = Reference(tiny.path)
    first = ref.score([5, 6, 7, 8], [9, 10], 4)
    assert (cache.counts.hits, cache.counts.misses) == (0, 1) and len(entries(cached)) == 1
    again = Reference(tiny.path).score([5, 6, 7, 8], [9, 10], 4)
    assert cache.counts.hits == 1 and again == first  # every float of every step, bit for bit
    long = LongReference(tiny.path)
    assert long.score_from([5, 6, 7, 8], [9, 10], 4, 2) == long.score_from([5, 6, 7, 8], [9, 10], 4, 2)
    assert cache.counts.hits == 2



def test_compute_seconds_count_computes_not_reads(cached: Path, monkeypatch, tmp_path: Path):
    """The run's `reference` phase sums these: a computed result adds its seconds, a read adds none."""
    clock = iter([10.0, 12.5, 20.0, 21.0])
    monkeypatch.setattr(cache.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(cache, "content_hash", lambda model_dir: "model")
    result = Completion([1, 2], [3], [], [])
    assert cache.counts.compute_s == 0.0  # enable() reset it
    assert cache.completion(tmp_path, {}, ["score", [1, 2], [3], 1], lambda: result) == result
    assert cache.counts.compute_s == 2.5 and cache.counts.misses == 1
    cache.completion(tmp_path, {}, ["score", [1, 2], [3], 1], lambda: result)
    assert cache.counts.compute_s == 2.5 and cache.counts.hits == 1
    cache.disable()
    cache.completion(tmp_path, {}, ["score", [1, 2], [3], 1], lambda: result)  # off: computed, and timed
    assert cache.counts.compute_s == 3.5


def test_several_calls_compute_only_those_the_cache_lacks_together_in_order(cached: Path, monkeypatch, tmp_path: Path):
    """`completions` (the reference's score_all): cached results are read, the others computed by one call with
    just them, and every result comes back in the order asked."""
    monkeypatch.setattr(cache, "content_hash", lambda model_dir: "model")
    calls = [["score", [1, n], [3], 1] for n in range(4)]
    made = lambda c: Completion(c[1], c[2], [], [])  # noqa: E731
    cache.completion(tmp_path, {}, calls[1], lambda: made(calls[1]))
    cache.completion(tmp_path, {}, calls[3], lambda: made(calls[3]))
    asked = []
    got = cache.completions(tmp_path, {}, calls, lambda missing: asked.append(missing) or [made(c) for c in missing])
    assert asked == [[calls[0], calls[2]]] and [c.prompt_ids for c in got] == [[1, 0], [1, 1], [1, 2], [1, 3]]
    assert cache.counts.hits == 2 and cache.counts.misses == 4
    assert cache.completions(tmp_path, {}, calls, lambda missing: 1 / 0) == got  # all read: nothing computed


def test_another_path_variant_or_checkpoint_is_computed(tiny, cached: Path, tmp_path: Path):
    Reference(tiny.path).score([5, 6, 7], [8], 4)
    Reference(tiny.path).score([5, 6, 7], [9], 4)  # the engine took another token: another result
    Reference(tiny.path, "yarn_rounded").score([5, 6, 7], [8], 4)  # a mutant never reads the true result
    LongReference(tiny.path, kv_quant="e4m3fn").score([5, 6, 7], [8], 4)
    assert cache.counts.hits == 0 and cache.counts.misses == 4
    other = tmp_path / "other"
    shutil.copytree(tiny.path, other)
    Reference(other).score([5, 6, 7], [8], 4)
    assert cache.counts.hits == 1, "the same bytes elsewhere are the same checkpoint"
    weights = next(other.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the checkpoint differs, rewritten in place
    weights.write_bytes(bytes(data))
    Reference(other).score([5, 6, 7], [8], 4)
    assert cache.counts.hits == 1 and cache.counts.misses == 5 and len(entries(cached)) == 5


def test_a_damaged_entry_is_computed_again_and_rewritten(tiny, cached: Path):
    want = Reference(tiny.path).score([5, 6, 7], [8], 4)
    (entry,) = entries(cached)
    for garbage in ("{not json", '{"prompt_ids": [1], "token_ids": [8], "steps": [], "prompt_steps": []}', ""):
        entry.write_text(garbage)
        assert Reference(tiny.path).score([5, 6, 7], [8], 4) == want
    assert cache.counts.hits == 0 and cache.counts.misses == 4
    assert Reference(tiny.path).score([5, 6, 7], [8], 4) == want and cache.counts.hits == 1


def test_a_checkpoint_is_read_once_per_state_of_its_files(tmp_path: Path, monkeypatch):
    """#38: the model's record and the reference's keys both need the checkpoint's content hash, a minute's read at
    gpt-oss-120b's size. It is read once per state of the files, kept in this process and in the suite cache; a
    file of another size, a damaged memo or a file changed in the last two seconds (whose times a second change
    could keep) is read again."""
    import hashlib
    import json

    from conformance import datafiles

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    want = hashlib.sha256(b"config.json{}model.safetensorsweights").hexdigest()  # the definition, unchanged
    reads = []
    read_through = datafiles._read_through
    monkeypatch.setattr(datafiles, "_read_through", lambda files: reads.append(1) or read_through(files))

    assert datafiles.content_hash(model) == datafiles.content_hash(model) == want and len(reads) == 2  # just written
    monkeypatch.setattr(datafiles, "RACY_NS", 0)
    assert datafiles.content_hash(model) == want and len(reads) == 3
    monkeypatch.setattr(datafiles, "_digests", {})  # another run on this node: the memo on disk answers
    assert datafiles.content_hash(model) == want and len(reads) == 3
    assert list(json.loads((tmp_path / "cache" / datafiles.HASH_MEMO).read_text()).values()) == [want]

    (model / "model.safetensors").write_bytes(b"weights, changed")
    changed = hashlib.sha256(b"config.json{}model.safetensorsweights, changed").hexdigest()
    assert datafiles.content_hash(model) == changed and len(reads) == 4

    (tmp_path / "cache" / datafiles.HASH_MEMO).write_text("{not json")
    monkeypatch.setattr(datafiles, "_digests", {})
    assert datafiles.content_hash(model) == changed and len(reads) == 5  # a damaged memo: read again, replaced
    assert list(json.loads((tmp_path / "cache" / datafiles.HASH_MEMO).read_text()).values()) == [changed]


def _close(a: Completion, b: Completion) -> float:
    """The largest difference between two results of one path (each step's tokens and entries the same)."""
    worst = 0.0
    assert (a.prompt_ids, a.token_ids) == (b.prompt_ids, b.token_ids)
    for sa, sb in zip(a.prompt_steps + a.steps, b.prompt_steps + b.steps, strict=True):
        assert sa.token == sb.token and set(sa.top) == set(sb.top)
        worst = max(worst, *(abs(sa.top[t] - sb.top[t]) for t in sa.top))
    return worst


def test_a_run_cuts_a_shorter_path_from_a_longer_one_through_the_same_prompt(tiny, monkeypatch):
    """Within a run (here with the cache itself off, as --fresh-reference runs), a scored path answers the shorter
    paths of the same prompt, model, variant and top-k that its tokens begin with: cut, not computed, and what the
    reference computes for that path (the reference is causal). Another first token, a longer path, another top-k
    or another variant is computed; outside a run nothing is cut."""
    prompt = [5, 6, 7, 8]
    cache.reset_counts()  # a run's start
    try:
        Reference(tiny.path).score(prompt, [9, 10, 11], 25)

        def computed(*args):
            raise AssertionError("computed a result a longer path of the run holds")

        with monkeypatch.context() as m:
            m.setattr(Reference, "_score", computed)
            cut = Reference(tiny.path).score(prompt, [9], 25)
            assert Reference(tiny.path).score(prompt, [9, 10], 25).token_ids == [9, 10]
            assert Reference(tiny.path).score(prompt, [], 25).token_ids == []
        assert cache.counts.derived == 3 and cache.counts.misses == 1 and cache.counts.hits == 0
        for tokens, k, variant in (([10], 25, None), ([9, 10, 11, 12], 25, None), ([9], 20, None),
                                   ([9], 25, "sinks_dropped")):
            Reference(tiny.path, variant).score(prompt, tokens, k)
        assert cache.counts.derived == 3 and cache.counts.misses == 5
    finally:
        cache.disable()
    direct = Reference(tiny.path).score(prompt, [9], 25)  # outside a run: computed
    assert cache.counts.derived == 3 and len(cut.steps) == 1 and _close(cut, direct) < 1e-12


def test_a_step_cut_to_a_smaller_top_k_is_the_step_read_with_it(tiny):
    """Greedy parity asks every path for compare.SCORED_TOP_K and cuts each side to its own top-k: the cut step is
    the one the reference gives for that top-k, with the chosen token kept where it falls outside it."""
    from conformance.verdicts.compare import SCORED_TOP_K

    row = Reference(tiny.path).logprobs([5, 6, 7, 8])[-1]
    order = row.argsort(descending=True).tolist()
    for chosen in (order[0], order[7], order[-1]):
        for k in (5, 10, 20):
            assert StepLogprobs.from_row(row, SCORED_TOP_K, chosen).cut(k) == StepLogprobs.from_row(row, k, chosen)
