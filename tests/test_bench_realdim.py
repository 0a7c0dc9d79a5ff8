"""`nox -s bench -- --realdim 2,8,24` (conformance/tooling/bench_realdim.py, bench.py): the plan of real-dimension
checkpoints, the tables per layer count on recorded H200 runs, and the fit of wall against layers. No checkpoint is
written here: the writer and the runs are stood in for."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.checkpoints.quant import realdim
from conformance.checkpoints.quant.realdim import checkpoint_bytes, tensor_sizes
from conformance.tooling import bench, bench_realdim

DEVICE_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "device_runs"
REALDIM_2_LAYERS = ["20261201T131759-cuda-da3bc7", "20261201T132918-cuda-f443fa", "20261201T134244-cuda-b8c3be"]


def realdim_record(index: int = 0) -> dict:
    return json.loads((DEVICE_RUNS / REALDIM_2_LAYERS[index] / "results.json").read_text())


# -- the checkpoints ------------------------------------------------------------------------------------

def test_disk_use_follows_the_writers_tensors():
    assert sum(tensor_sizes("gpt-oss-120b", 2)) == realdim_record()["model"]["num_params"]  # the H200 run's count
    per_layer = checkpoint_bytes("gpt-oss-120b", 3) - checkpoint_bytes("gpt-oss-120b", 2)
    assert 1.7e9 < per_layer < 1.8e9  # 128 MXFP4 experts a layer: why 36 layers do not fit a 64 GB disk
    assert checkpoint_bytes("gpt-oss-120b", 36) > 64e9 > checkpoint_bytes("gpt-oss-120b", 24)


def test_layer_counts_parse_sorted_once_and_refuse_nonsense():
    assert bench_realdim.parse_layers("8,2, 24,2") == [2, 8, 24]
    for bad in ("", "two", "0,2", "2;8"):
        with pytest.raises(bench_realdim.RealdimError, match="--realdim wants layer counts like 2,8,24"):
            bench_realdim.parse_layers(bad)


def fake_checkpoint(path: Path, layers: int) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s0.safetensors"}}))
    (path / "s0.safetensors").write_bytes(b"")
    (path / "tokenizer.json").write_text("{}")
    return path


def test_plan_reuses_a_complete_checkpoint_only(tmp_path):
    fake_checkpoint(bench_realdim.checkpoint_dir(tmp_path, "gpt-oss-120b", 2), 2)
    half = fake_checkpoint(bench_realdim.checkpoint_dir(tmp_path, "gpt-oss-120b", 8), 8)
    (half / "tokenizer.json").unlink()  # a writer that stopped before its end
    two, eight, four = bench_realdim.plan([2, 8, 4], tmp_path, "gpt-oss-120b", sys.executable)  # the writer asked
    assert (two.present, eight.present, four.present) == (True, False, False)
    assert two.path.name == "realdim-gpt-oss-120b-2-layers" and two.bytes == checkpoint_bytes("gpt-oss-120b", 2)


def test_the_writer_answers_sizes_and_the_cache_place(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    realdim.main(["--sizes", "2,24", "--variant", "gpt-oss-20b"])
    assert json.loads(capsys.readouterr().out) == {
        "bytes": {"2": checkpoint_bytes("gpt-oss-20b", 2), "24": checkpoint_bytes("gpt-oss-20b", 24)},
        "root": str(tmp_path / "realdim")}
    assert bench_realdim.real_layers("gpt-oss-120b") == 36 and bench_realdim.real_layers("gpt-oss-20b") == 24


def test_a_checkpoint_the_disk_cannot_hold_is_refused_before_writing(tmp_path):
    ckpt = bench_realdim.Checkpoint(36, tmp_path / "realdim-gpt-oss-120b-36-layers", 65_000_000_000, False)
    with pytest.raises(bench_realdim.RealdimError) as err:
        bench_realdim.check_disk(ckpt, 60_000_000_000)
    assert str(err.value) == (f"the 36-layer checkpoint needs 68.2 GB and {tmp_path} has 60.0 GB free: bench fewer "
                              "layers or free the disk.")
    bench_realdim.check_disk(bench_realdim.Checkpoint(36, ckpt.path, ckpt.bytes, True), 0)  # already there


def test_layers_of_a_recorded_run():
    assert bench_realdim.layers_of(realdim_record()) == 2
    tiny = json.loads((DEVICE_RUNS / "20261203T165223-cuda-0ad1a6" / "results.json").read_text())
    assert bench_realdim.layers_of(tiny) is None


# -- the fit ------------------------------------------------------------------------------------------------

def test_fit_recovers_a_line_and_extrapolates():
    fit = bench_realdim.fit([(2, 130.0), (8, 250.0), (24, 570.0), (2, 130.0)])
    assert fit.a == pytest.approx(90.0) and fit.b == pytest.approx(20.0) and fit.r2 == pytest.approx(1.0)
    assert fit.at(36) == pytest.approx(810.0) and fit.n == 4


def test_fit_of_noisy_points_is_least_squares():
    fit = bench_realdim.fit([(2, 100.0), (2, 120.0), (8, 260.0), (8, 240.0)])
    assert (fit.a, fit.b) == (pytest.approx(190.0 / 3), pytest.approx(70.0 / 3))  # through the two means
    assert fit.r2 == pytest.approx(1 - 400.0 / 20000.0)
    assert bench_realdim.fit([(2, 100.0), (8, 250.0)]).r2 is None  # two points: a line through both, no r2


def test_fit_needs_two_layer_counts():
    with pytest.raises(bench_realdim.RealdimError, match=r"needs runs at two layer counts at least \(got \[2\]\)"):
        bench_realdim.fit([(2, 400.0), (2, 410.0)])


def test_format_fit_compares_the_extrapolation_with_the_goal():
    by_layers = {2: [{"wall": 492.0, "engine: transformers engine #1": 31.0, "reference": 200.0}],
                 8: [{"wall": 1200.0, "engine: transformers engine #1": 34.0, "reference": 800.0}]}
    text = bench_realdim.format_fit("p0", by_layers, 36)
    first = text.splitlines()[0]
    assert first.startswith("P0 wall against layers (2 runs at [2, 8] layers): 256.0 s + 118.00 s x layers; "
                            "at 36 layers 4504 s = 75.1 min, over the 10-minute goal (7.51 x)")
    rows = [line.split()[0] for line in text.splitlines()[2:]]
    assert rows[0] == "reference"  # the phase largest at 36 layers first
    assert "within the 10-minute goal" in bench_realdim.format_fit(
        "p0", {2: [{"wall": 100.0}], 8: [{"wall": 130.0}]}, 36)
    # on the H200 on 2026-12-06: the 2-layer run started cold (250 s), the 8-layer one warm (239 s)
    falling = bench_realdim.format_fit("p0", {2: [{"wall": 250.2}], 8: [{"wall": 239.4}]}, 36).splitlines()[0]
    assert falling.endswith("253.8 s + -1.80 s x layers: the wall does not grow with depth across these runs, so it "
                            "says nothing of 36 layers; their fixed costs differ (the phases below grow)")
    assert "goal" not in falling


# -- bench: tables per layer count, from recorded runs and from (stood-in) runs ------------------------------

def test_from_runs_tables_the_h200_realdim_runs_per_layer_count(capsys):
    assert bench.main(["--from-runs", *(str(DEVICE_RUNS / r) for r in REALDIM_2_LAYERS)]) == 0
    out = capsys.readouterr().out  # one table per dtype: their walls differ
    assert out.startswith("P0 bfloat16 · transformers · NVIDIA H200 at 2 layers: 1 run(s)")
    assert "\nP0 float16 · transformers · NVIDIA H200 at 2 layers: 2 run(s)" in out
    assert "check: test_exact_float32_logprobs_match_reference" in out
    assert "P0 float16 · transformers · NVIDIA H200: runs at one layer count (2): no fit of wall against layers" in out


def written_sizes(layer_counts, variant, python):
    """`realdim --sizes` without its child process (which imports torch)."""
    return {"bytes": {str(n): checkpoint_bytes(variant, n) for n in layer_counts}, "root": "unused"}


def test_realdim_bench_writes_each_checkpoint_once_runs_it_and_fits(tmp_path, monkeypatch, capsys):
    written, runs = [], []

    def generate(ckpt, variant, python):
        fake_checkpoint(ckpt.path, ckpt.layers)
        written.append(ckpt.layers)
        return 30.0 * ckpt.layers

    def run_once(tier, index, reports_dir, nox, extra, label="", env=None):
        model = Path(extra[extra.index("--model") + 1])
        assert model.is_dir() and label == f"-L{len(written) and written[-1]}"
        layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
        record = copy.deepcopy(realdim_record())
        record["model"] |= {"name": str(model), "path": str(model)}
        record["phases"] |= {"wall": 100.0 + 20.0 * layers + 2 * index, "reference": 10.0 * layers,
                             "load": 2.0 * layers}
        runs.append((tier, layers, extra))
        return record, record["phases"]["wall"] + 5.0, 0.5

    monkeypatch.setattr(bench_realdim, "generate", generate)
    monkeypatch.setattr(bench_realdim, "free_bytes", lambda root: 10**12)
    monkeypatch.setattr(bench_realdim, "sizes", written_sizes)
    monkeypatch.setattr(bench, "run_once", run_once)
    root = tmp_path / "realdim"
    code = bench.main(["--realdim", "2,8", "--tiers", "p0", "--runs", "2", "--realdim-dir", str(root),
                       "--reports-dir", str(tmp_path / "runs"), "--", "--cuda"])
    assert code == 0 and written == [2, 8]
    assert [(t, L) for t, L, _ in runs] == [("p0", 2), ("p0", 2), ("p0", 8), ("p0", 8)]
    assert all(extra[0] == "--cuda" for _, _, extra in runs)
    assert not list(root.iterdir()), "the checkpoints the bench wrote are removed after their runs"
    out = capsys.readouterr().out
    head = "P0 bfloat16 · transformers · NVIDIA H200 at {} layers: 2 run(s)"
    two = out[out.index(head.format(2)):out.index(head.format(8))]
    assert next(line for line in two.splitlines() if line.startswith("generate")).split()[1:4] == ["60.00s"] * 3
    assert next(line for line in two.splitlines() if line.startswith("reference")).split()[1] == "20.00s"
    assert "P0 bfloat16 · transformers · NVIDIA H200 wall against layers (4 runs at [2, 8] layers, r2 " in out
    assert "101.0 s + 20.00 s x layers; at 36 layers 821 s = 13.7 min, over the 10-minute goal" in out


def test_realdim_bench_keeps_and_reuses_checkpoints(tmp_path, monkeypatch, capsys):
    root = tmp_path / "realdim"
    fake_checkpoint(bench_realdim.checkpoint_dir(root, "gpt-oss-120b", 2), 2)
    monkeypatch.setattr(bench_realdim, "generate", lambda *a: pytest.fail("a complete checkpoint is rewritten"))
    monkeypatch.setattr(bench_realdim, "sizes", written_sizes)

    def run_once(tier, index, reports_dir, nox, extra, label="", env=None):
        record = copy.deepcopy(realdim_record())
        return record, record["phases"]["wall"], 0.0

    monkeypatch.setattr(bench, "run_once", run_once)
    assert bench.main(["--realdim", "2", "--tiers", "p0", "--runs", "1", "--realdim-dir", str(root),
                       "--reports-dir", str(tmp_path / "runs")]) == 0
    assert bench_realdim.is_complete(bench_realdim.checkpoint_dir(root, "gpt-oss-120b", 2), 2)  # not the bench's
    assert not any(line.startswith("generate") for line in capsys.readouterr().out.splitlines())


def test_realdim_bench_refuses_a_checkpoint_too_big_in_one_sentence(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_realdim, "free_bytes", lambda root: 10 * 10**9)
    monkeypatch.setattr(bench_realdim, "sizes", written_sizes)
    monkeypatch.setattr(bench, "run_once", lambda *a, **k: pytest.fail("ran without its checkpoint"))
    assert bench.main(["--realdim", "8", "--realdim-dir", str(tmp_path), "--reports-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("bench: the 8-layer checkpoint needs 17.1 GB and ")


def test_the_writer_without_a_vocab_says_so_in_one_sentence_before_writing_anything(tmp_path):
    """A node without the o200k vocabulary (no quicktok-v1, no CONFORMANCE_TOKENIZER_VOCAB that reads) is told before
    the writer spends a minute on gigabytes of weights it could not finish; the directory is left unmade."""
    out = tmp_path / "realdim-1"
    env = os.environ | {"CONFORMANCE_TOKENIZER_VOCAB": str(tmp_path / "absent.tiktoken")}
    done = subprocess.run([sys.executable, "-m", "conformance.checkpoints.quant.realdim", str(out), "--layers", "1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.count("\n") == 1 and "nothing written" in done.stderr and "cannot read the o200k vocabulary" \
        in done.stderr, done.stderr


def test_the_writer_draws_each_part_alone_so_layer_counts_nest_and_workers_do_not_matter(tmp_path, monkeypatch):
    """Each shard comes from a generator of its own, drawn in its own process: the checkpoint is the same bytes
    whether one process or several draw it, and layer 0 and the embeddings of the 1-layer checkpoint are those of
    the 2-layer one (the real dimensions shrunk here: the shapes are the real writer's, the sizes are not)."""
    from conformance.checkpoints.tokenizer import hf_build

    small = realdim.real_config("gpt-oss-120b", 2) | {"hidden_size": 64, "intermediate_size": 64,
                                                       "num_local_experts": 4, "vocab_size": 300}
    monkeypatch.setattr(realdim, "real_config", lambda variant, layers: small | {"num_hidden_layers": layers})
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    for name in hf_build.TOKENIZER_FILES:
        (vocab / name).write_text("{}")
    monkeypatch.setattr(realdim, "_tokenizer_dir", lambda: vocab)
    monkeypatch.setattr(realdim, "_workers", lambda parts: 1)
    alone = realdim.write(tmp_path / "one-process", layers=2)
    monkeypatch.setattr(realdim, "_workers", lambda parts: parts)
    two, one = realdim.write(tmp_path / "two", layers=2), realdim.write(tmp_path / "one", layers=1)

    def shard(ckpt, n, of):
        return (ckpt / f"model-{n:05d}-of-{of:05d}.safetensors").read_bytes()

    assert [shard(alone, n, 4) for n in range(4)] == [shard(two, n, 4) for n in range(4)]
    assert shard(one, 0, 3) == shard(two, 0, 4) and shard(one, 1, 3) == shard(two, 1, 4)  # embeddings, layer 0
    assert shard(two, 1, 4) != shard(two, 2, 4)
    index = json.loads((two / "model.safetensors.index.json").read_text())["weight_map"]
    assert index["model.layers.1.mlp.experts.gate_up_proj_blocks"] == "model-00002-of-00004.safetensors"
    assert index["lm_head.weight"] == "model-00003-of-00004.safetensors"


def test_a_weights_only_checkpoint_needs_no_vocabulary(tmp_path, monkeypatch, capsys):
    """--weights-only writes the weights and config a node without the o200k vocabulary can give the device
    reference's agreement command; without it, such a node is refused before any weight is drawn."""
    from conformance.checkpoints.tokenizer.vocab import VocabUnavailable

    small = realdim.real_config("gpt-oss-120b", 1) | {"hidden_size": 64, "intermediate_size": 64,
                                                       "num_local_experts": 4, "vocab_size": 300}
    monkeypatch.setattr(realdim, "real_config", lambda variant, layers: small | {"num_hidden_layers": layers})
    monkeypatch.setattr(realdim, "_workers", lambda parts: 1)

    def no_vocab() -> None:
        raise VocabUnavailable("no o200k vocabulary here")

    monkeypatch.setattr(realdim, "_tokenizer_dir", no_vocab)
    with pytest.raises(SystemExit) as refused:
        realdim.main([str(tmp_path / "full"), "--layers", "1"])
    assert refused.value.code == 2 and not (tmp_path / "full").exists()
    realdim.main([str(tmp_path / "weights"), "--layers", "1", "--weights-only"])
    written = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert written == ["config.json", "generation_config.json", "model-00000-of-00003.safetensors",
                       "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                       "model.safetensors.index.json"]
    assert json.loads((tmp_path / "weights" / "config.json").read_text())["num_hidden_layers"] == 1
    from conformance.reference import device

    capsys.readouterr()
    assert device.main(["--model", str(tmp_path / "weights"), "--device", "cpu", "--tokens", "8"]) == 0
    assert "MXFP4 matrices widened" in capsys.readouterr().out


def test_from_runs_never_fits_runs_of_other_options_together(capsys):
    """The H200's 2-layer vLLM P0 captured vLLM's 83 graph sizes (a P0 before profiles.toml [gate]); its 8-layer P0
    took the gate's 64: their walls are not one line, so each is tabled alone and no fit is drawn across them."""
    runs = ["20261204T163955-bench-p0-L2-0", "20261204T202034-bench-p0-L8-0"]
    assert bench.main(["--from-runs", *(str(DEVICE_RUNS / r) for r in runs)]) == 0
    out = capsys.readouterr().out
    assert "P0 bfloat16 · vllm · NVIDIA H200 at 2 layers: 1 run(s)" in out
    assert "P0 bfloat16 · vllm · gate options · NVIDIA H200 at 8 layers: 1 run(s)" in out
    assert " layers (2 runs at" not in out and out.count("runs at one layer count") == 2


def test_from_runs_never_fits_an_h100_run_with_the_h200_s(capsys):
    """The 16-layer first node of 2026-12-05 ran on an H100, every earlier count on the H200 (the same gate options):
    the H100's run is tabled under its card and joins no fit of the H200's."""
    runs = ["20261205T142355-bench-p0-L2-0", "20261205T141217-bench-p0-L24-0", "20261205T161856-bench-p0-L16-0"]
    assert bench.main(["--from-runs", *(str(DEVICE_RUNS / r) for r in runs)]) == 0
    out = capsys.readouterr().out
    assert "P0 bfloat16 · vllm · gate options · NVIDIA H100 80GB HBM3 at 16 layers: 1 run(s)" in out
    assert "gate options · NVIDIA H200 wall against layers (2 runs at [2, 24] layers" in out
    assert out.count("runs at one layer count") == 1


def test_a_second_node_run_reads_the_pack_with_an_empty_cache_and_is_tabled_apart(tmp_path, monkeypatch, capsys):
    """#38's second node: after the first runs (which write the run's --reference-pack), one more run per tier with
    the suite's cache pointed at an empty folder, so its fp64 results can only come from the pack, and vLLM's,
    Triton's and Inductor's caches empty too, as on a fresh node; its table is its own (`· second node`). Without
    --reference-pack the bench refuses in one sentence, before anything runs."""
    runs = []

    def run_once(tier, index, reports_dir, nox, extra, label="", env=None):
        second = label.endswith("second-node")
        if second:
            assert set(env) == {"CONFORMANCE_CACHE", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"}
            for cache in map(Path, env.values()):
                assert cache.is_dir() and not list(cache.iterdir()), "the second node starts with empty caches"
        else:  # the first node fills the suite's cache at the path the second node will find empty
            assert set(env) == {"CONFORMANCE_CACHE"}
            Path(env["CONFORMANCE_CACHE"]).mkdir(parents=True)
            (Path(env["CONFORMANCE_CACHE"]) / "slice").write_text("")
        record = copy.deepcopy(realdim_record())
        record["phases"] |= {"wall": 300.0 if second else 500.0, "reference": 1.0 if second else 200.0}
        runs.append((label, extra, dict(env)))
        return record, record["phases"]["wall"], 0.5

    monkeypatch.setattr(bench, "run_once", run_once)
    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path / "home-cache" / "gpu-llm-conformance"))
    pack = str(tmp_path / "packs")
    assert bench.main(["--tiers", "p0", "--runs", "1", "--second-node", "--reports-dir", str(tmp_path / "runs"),
                       "--", "--cuda", "--reference-pack", pack]) == 0
    assert [(label, extra[-1]) for label, extra, env in runs] == [("", pack), ("-second-node", pack)]
    # one path for the suite's cache on both nodes, as on a fleet (the twin's slice path is in vLLM's compile key),
    # beside the user's own suite cache (the exact check's slice is 15 GB at 120b's dimensions)
    assert runs[0][2]["CONFORMANCE_CACHE"] == runs[1][2]["CONFORMANCE_CACHE"]
    assert all(Path(path).is_relative_to(tmp_path / "home-cache") for path in runs[1][2].values())
    assert not Path(runs[1][2]["CONFORMANCE_CACHE"]).exists(), "the nodes' caches are removed after the runs"
    out = capsys.readouterr().out
    first = out[out.index("P0 bfloat16 · transformers · NVIDIA H200 at 2 layers: 1 run(s)"):]
    second = out[out.index("P0 bfloat16 · transformers · NVIDIA H200 · second node at 2 layers: 1 run(s)"):]
    assert next(line for line in first.splitlines() if line.startswith("reference")).split()[1] == "200.00s"
    assert next(line for line in second.splitlines() if line.startswith("reference")).split()[1] == "1.00s"

    runs.clear()
    assert bench.main(["--tiers", "p0", "--second-node", "--", "--cuda"]) == 2 and not runs
    assert capsys.readouterr().err.strip() == ("bench: --second-node reads the first runs' reference pack: give the "
                                               "runs --reference-pack DIR (after --).")


def test_a_second_node_that_found_the_fleets_compile_cache_is_tabled_as_such(tmp_path, monkeypatch, capsys):
    """With the runs' --compile-cache, the second node's record says it found the first runs' kernels (warm): its
    table says so, so that its engine starts are never read as a fresh node's; the first runs (which filled it) are
    tabled as before."""
    def run_once(tier, index, reports_dir, nox, extra, label="", env=None):
        record = copy.deepcopy(realdim_record())
        warm = label.endswith("second-node")
        record["compile_cache"] = {"path": extra[-1], "warm": warm, "files_at_start": 9 if warm else 0,
                                   "files_at_end": 9}
        return record, 100.0, 0.5

    monkeypatch.setattr(bench, "run_once", run_once)
    assert bench.main(["--tiers", "p0", "--runs", "1", "--second-node", "--reports-dir", str(tmp_path / "runs"),
                       "--", "--cuda", "--reference-pack", str(tmp_path / "packs"),
                       "--compile-cache", str(tmp_path / "cc")]) == 0
    out = capsys.readouterr().out
    assert "P0 bfloat16 · transformers · NVIDIA H200 at 2 layers: 1 run(s)" in out
    assert "P0 bfloat16 · transformers · fleet's compile cache · NVIDIA H200 · second node at 2 layers: 1 run(s)" in out


def test_a_fit_across_machines_says_so_and_one_machine_s_says_nothing(capsys):
    """The 24-layer H200 run of 2026-12-06 04:34 and the 2- and 8-layer runs of 01:55 came from two H200s (their
    hosts at 4.02-8.37 M single-thread ops/s): the fit is drawn, and a line under it says it is not one machine's.
    The three H100 runs of 2026-12-05 21:30-21:42 came from one machine: no such line."""
    runs = ["20261206T015503-bench-p0-L2-0", "20261206T015937-bench-p0-L8-0", "20261206T043410-bench-p0-L24-0"]
    assert bench.main(["--from-runs", *(str(DEVICE_RUNS / r) for r in runs)]) == 0
    out = capsys.readouterr().out
    fit = out[out.index("NVIDIA H200 wall against layers"):]
    assert "at 36 layers 509 s" in fit.splitlines()[0]
    assert fit.splitlines()[1] == ("(these 3 runs come from 2 machines, host single-thread 4.02-8.37 M ops/s: not like "
                                   "for like; only runs of one machine make a fit of one machine)")
    one = ["20261205T213841-bench-p0-L2-0", "20261205T214216-bench-p0-L8-0", "20261205T213034-bench-p0-L16-0"]
    assert bench.main(["--from-runs", *(str(DEVICE_RUNS / r) for r in one)]) == 0
    out = capsys.readouterr().out
    assert "H100 80GB HBM3 wall against layers (3 runs" in out and "machines" not in out
