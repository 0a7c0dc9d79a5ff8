"""Reference packs (conformance/reference/pack.py): a second run with the pack of a first computes no reference
result; a pack made for another model, prompt set or reference version is refused in one sentence and left as it
was; through the plugin, `--reference-pack` is a usage error for another key, and a second run reads the first's."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.reference import cache, pack
from conformance.reference.gpt_oss import Reference
from conformance.verdicts import settings
from tests.test_run_options import run_plugin


def _open(where: Path, tiny, read: bool) -> pack.Pack:
    return pack.open_for_run(where, tiny.path, settings.tiny_prompts, read=read)


def _key(model_dir: Path) -> pack.PackKey:
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return pack.run_key(model_dir, settings.tiny_prompts(int(vocab)))

CALLS = [([5, 6, 7, 8], [9, 10]), ([11, 12], [13])]


@pytest.fixture
def no_cache():
    yield
    cache.disable()  # the pack is written and closed even where a test failed


def score_all(model_dir: Path) -> list:
    return [Reference(model_dir).score(prompt, continuation, 4) for prompt, continuation in CALLS]


def forbid_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    def compute(*args):
        raise AssertionError("the reference computed a result the pack holds")

    monkeypatch.setattr(Reference, "_score", compute)


def test_a_second_run_with_the_pack_computes_nothing(tiny, tmp_path: Path, monkeypatch, no_cache):
    first = _open(tmp_path, tiny, read=True)  # a directory: the key names the file
    want = score_all(tiny.path)
    assert first.added == len(CALLS) and first.hits == 0
    cache.disable()
    (written,) = tmp_path.glob("reference-*.json")
    assert written == first.path and written.name == _key(tiny.path).file_name()

    forbid_compute(monkeypatch)
    second = _open(written, tiny, read=True)
    assert score_all(tiny.path) == want  # every float of every step
    assert second.hits == len(CALLS) and second.added == 0
    cache.disable()
    assert written.read_text() == json.dumps(json.loads(written.read_text())), "unchanged, not rewritten"


def test_results_read_from_the_cache_go_into_the_pack(tiny, tmp_path: Path, monkeypatch, no_cache):
    """A node whose local cache already holds the results still writes a complete pack."""
    cache.enable(tmp_path / "results")
    score_all(tiny.path)
    cache.disable()
    cache.enable(tmp_path / "results")
    forbid_compute(monkeypatch)
    written = _open(tmp_path / "fleet.json", tiny, read=True)
    score_all(tiny.path)
    assert cache.counts.hits == len(CALLS) and written.added == len(CALLS)
    cache.disable()
    assert len(json.loads(written.path.read_text())["results"]) == len(CALLS)


def test_fresh_reference_computes_and_writes_but_does_not_read(tiny, tmp_path: Path, no_cache):
    _open(tmp_path, tiny, read=True)
    score_all(tiny.path)
    cache.disable()
    fresh = _open(tmp_path, tiny, read=False)
    score_all(tiny.path)
    assert fresh.hits == 0 and cache.counts.misses == 2 * len(CALLS)


@pytest.mark.parametrize("field", ["model", "prompts", "reference"])
def test_a_pack_for_another_key_is_refused_in_one_sentence(tiny, tmp_path: Path, field: str, no_cache):
    key = _key(tiny.path)
    other = pack.Pack(tmp_path / "other.json", replace(key, **{field: "0" * 64}))
    other.put("k", Reference(tiny.path).score([1, 2], [3], 2))
    other.write()
    before = other.path.read_bytes()
    with pytest.raises(pack.PackRefused) as exc:
        # another prompt set or version: before anything runs; another model: where the run first needs the pack
        # (its key needs the checkpoint's hash, which the run does not wait for at its start)
        _open(other.path, tiny, read=True)
        assert field == "model", "refused at once"
        score_all(tiny.path)
    msg = str(exc.value)
    assert f"was made for another {field} than this run's ({field} 000000000000 against {getattr(key, field)[:12]})" \
        in msg and msg.endswith("or a directory of packs.") and "\n" not in msg
    cache.disable()
    assert cache.pack() is None and other.path.read_bytes() == before


def test_the_key_follows_model_bytes_and_prompt_set(tiny, tmp_path: Path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(tiny.path, copy)
    assert _key(copy) == _key(tiny.path), "the same bytes elsewhere are the same model"
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"vocab_size": config["vocab_size"] // 2}))
    changed = _key(copy)
    assert changed.model != _key(tiny.path).model and changed.prompts != _key(tiny.path).prompts


@pytest.mark.parametrize("garbage", ["{not json", json.dumps({"format": "other/1", "key": {}, "results": {}})])
def test_a_file_that_is_not_a_pack_is_refused(tiny, tmp_path: Path, garbage: str, no_cache):
    path = tmp_path / "pack.json"
    path.write_text(garbage)
    with pytest.raises(pack.PackRefused, match=r"is not a reference pack of this suite \(.*\): pass one a run wrote"):
        _open(path, tiny, read=True)
    assert path.read_text() == garbage


CHECK = '''"""A check that scores the reference as the parity checks do (a fixture of tests/test_reference_pack.py)."""
import os

import pytest

from conformance.checkpoints.models import tiny_gpt_oss
from conformance.reference import cache
from conformance.reference.gpt_oss import Reference
from conformance.verdicts.verdict import fail


@pytest.mark.p0
def test_scores_the_reference(monkeypatch):
    """Catches: nothing.
    Reference: https://docs.pytest.org/
    Controls: tests/test_reference_pack.py::test_the_run_option_writes_reads_and_refuses"""
    if os.environ.get("FORBID_COMPUTE"):
        monkeypatch.setattr(Reference, "_score", lambda *a: fail("computed a result the pack holds"))
    got = Reference(tiny_gpt_oss().path).score([5, 6, 7, 8], [9, 11] if os.environ.get("PART") else [9, 10], 4)
    if len(got.steps) != 2:
        fail(f"{len(got.steps)} steps scored, not 2")
    if os.environ.get("FORBID_COMPUTE") and cache.pack().hits != 1:
        fail("read from the pack, not from the local cache")
'''


def test_the_run_option_writes_reads_and_refuses(tiny, tmp_path: Path):
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_scores.py").write_text(CHECK)
    packs = tmp_path / "packs"
    packs.mkdir()
    first = run_plugin(checks, "--fresh-reference", "--reference-pack", str(packs))  # no local cache involved
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    (written,) = packs.glob("reference-*.json")
    second = run_plugin(checks, "--fresh-reference", "--reference-pack", str(written), env={"FORBID_COMPUTE": "1"})
    assert second.returncode == 1, "fresh: the pack is not read"
    third = run_plugin(checks, "--reference-pack", str(written), env={"FORBID_COMPUTE": "1"})
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    # each run's record says what its reference did: the first computed, the third read everything from the pack
    done = [json.loads(f.read_text())["reference_results"]
            for f in sorted((tmp_path / "reports" / "runs").glob("*/results.json"), key=lambda f: f.stat().st_mtime_ns)]
    assert done[0]["computed"] >= 1 and done[0]["read"] == done[0]["from_pack"] == 0
    assert done[2]["computed"] == 0 and done[2]["read"] == done[2]["from_pack"] >= 1 and done[2]["compute_s"] == 0
    assert "pack_paths_parted" not in done[2]
    assert re.search(r"^reference: (\d+) of \1 fp64 results read from the reference pack \(", third.stdout, re.M)
    # a node whose engine decoded another path: computed, and the run says where the paths parted
    parted = run_plugin(checks, "--reference-pack", str(written), env={"PART": "1"})
    assert parted.returncode == 0, parted.stdout[-2000:] + parted.stderr[-2000:]
    assert "the engine's tokens parted from the pack's at decode step 1" in parted.stdout
    record = max((tmp_path / "reports" / "runs").glob("*/results.json"), key=lambda f: f.stat().st_mtime_ns)
    assert json.loads(record.read_text())["reference_results"]["pack_paths_parted"] == [1]

    data = json.loads(written.read_text())
    data["key"]["prompts"] = "f" * 64
    written.write_text(json.dumps(data))
    before = written.read_bytes()
    refused = run_plugin(checks, "--reference-pack", str(written))
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert f"ERROR: --reference-pack {written} was made for another prompts than this run's" in refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr and written.read_bytes() == before
    assert len(list((tmp_path / "reports" / "runs").iterdir())) == 4, "the refused run left no record"
    # another model's pack: its key waits for the checkpoint's hash, so the check that first asks fails with the
    # sentence, and the pack is left as it was
    data["key"] |= {"prompts": _key(tiny.path).prompts, "model": "f" * 64}
    written.write_text(json.dumps(data))
    before = written.read_bytes()
    other_model = run_plugin(checks, "--reference-pack", str(written))
    assert other_model.returncode == 1, other_model.stdout[-2000:] + other_model.stderr[-2000:]
    assert f"--reference-pack {written} was made for another model than this run's" in other_model.stdout
    assert written.read_bytes() == before


def test_a_path_that_parts_from_the_pack_s_is_computed_and_says_where(tiny, tmp_path: Path, no_cache):
    """A second node whose engine decoded other tokens for a prompt than the first's (bf16 greedy paths are not the
    same run to run: the H200 on 2026-12-05) gets that result computed, not the pack's, and the run says at which
    decode step the paths parted; a prompt the pack never held is no parting."""
    _open(tmp_path, tiny, read=True)
    score_all(tiny.path)
    cache.disable()
    (written,) = tmp_path.glob("reference-*.json")
    second = _open(written, tiny, read=True)
    cache.reset_counts()
    parted = Reference(tiny.path).score([5, 6, 7, 8], [9, 11], 4)  # the first node decoded [9, 10]
    fresh = Reference(tiny.path)._score([5, 6, 7, 8], [9, 11], 4)
    assert parted == fresh and parted.token_ids == [9, 11]
    Reference(tiny.path).score([1, 2, 3], [4], 4)  # a prompt the pack does not hold
    Reference(tiny.path).score(*CALLS[1], 4)  # the first node's own path: read
    assert (second.hits, second.parted) == (1, [1])
    assert cache.run_summary() | {"compute_s": 0} == {"computed": 2, "read": 1, "from_pack": 1, "derived": 0,
                                                      "compute_s": 0, "pack_paths_parted": [1]}
    assert second.parting(*CALLS[1]) is None and second.parting([5, 6, 7, 8], [8]) == 0
    assert second.parting([5, 6, 7, 8], [9, 10, 12]) == 2  # a longer path: it leaves where the pack's ends


def test_a_directory_s_pack_is_keyed_when_the_run_first_needs_it(tiny, tmp_path: Path, monkeypatch, no_cache):
    """No pack makes the run wait for the checkpoint's hash at its start (the run reads it in the background: 12 s at
    8 layers of gpt-oss-120b on the H200; the H100's 16-layer runs of 2026-12-05 with a FILE pack waited for it); a
    FILE is read at once, and refused then for another prompt set or version, but keyed by the model when first needed.
    A damaged file in the directory is refused in the check that first asks, and the run's end leaves it as it was."""
    hashed, model = [], _key(tiny.path).model
    monkeypatch.setattr(pack, "content_hash", lambda d: hashed.append(d) or model)
    lazy = _open(tmp_path, tiny, read=True)
    assert hashed == [] and lazy.hits == 0 and lazy.parted == []
    score_all(tiny.path)
    assert hashed == [tiny.path] and lazy.added == len(CALLS)
    cache.disable()
    (written,) = tmp_path.glob("reference-*.json")
    again = _open(written, tiny, read=True)
    assert hashed == [tiny.path], "a FILE is keyed when first needed, as a directory's pack is"
    score_all(tiny.path)
    assert hashed == [tiny.path] * 2 and again.hits == len(CALLS)
    cache.disable()

    written.write_text("{damaged")
    damaged = _open(tmp_path, tiny, read=True)
    with pytest.raises(pack.PackRefused, match="is not a reference pack of this suite"):
        score_all(tiny.path)
    cache.disable()  # writes nothing over it
    assert written.read_text() == "{damaged" and damaged.hits == 0
    untouched = _open(tmp_path, tiny, read=True)
    cache.disable()
    assert untouched._pack is None, "a run that never asked the reference never opened its pack"


def test_another_checkpoint_s_results_neither_read_nor_enter_the_pack(tiny, tmp_path: Path, no_cache):
    """The exact check scores a slice of the run's model (another checkpoint) in the same run: its paths are not the
    pack's to hold, nor partings from the pack's paths (an H100's first node on 2026-12-05 reported six partings at
    step 0, all of them the slice's own paths)."""
    run_pack = _open(tmp_path / "pack.json", tiny, read=True)
    Reference(tiny.path).score(*CALLS[0], 4)
    other = tmp_path / "slice"
    shutil.copytree(tiny.path, other)
    weights = next(other.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    Reference(other).score(CALLS[0][0], [8, 8], 4)  # the same prompt along another path, on another checkpoint
    assert run_pack.added == 1 and run_pack.parted == [] and run_pack.hits == 0
