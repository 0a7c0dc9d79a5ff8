"""`conformance checks`: the per-check reference and the failure catalogue, generated from the checks' source and the
data, and the `Limits:` field the plugin lints.

The committed pages under docs/ must be what the command writes now: a check, a limit in conformance/data, a
signature or a failure class that changed without `conformance checks --markdown` fails here, naming the pages."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.run import cli
from conformance.run.run_target import TIER_INFO
from conformance.run.runrecord import check_metadata_problems
from conformance.tooling import check_limits, check_pages, check_reference, failure_catalogue
from conformance.tooling.check_catalogue import read_checks

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DATA = ROOT / "conformance" / "data"


def test_the_committed_reference_is_what_the_command_writes():
    stale = check_reference.stale_pages(DOCS, TIER_INFO)
    assert not stale, (f"docs/ is not what `{check_reference.REGENERATE}` writes now: "
                       f"{', '.join(stale)}. Run `{check_reference.REGENERATE}` and commit docs/checks/ and "
                       "docs/failure-catalogue.md.")


def test_a_page_edited_by_hand_or_left_over_is_named(tmp_path):
    docs = tmp_path / "docs"
    (docs / "checks").mkdir(parents=True)
    (docs / "results.md").write_text((DOCS / "results.md").read_text())
    assert check_reference.main(["--markdown", "--docs", str(docs)], TIER_INFO) == 0
    assert check_reference.stale_pages(docs, TIER_INFO) == []
    page = docs / "checks" / "device.md"
    page.write_text(page.read_text().replace("rel_fro", "rel_frob"))
    (docs / "checks" / "attic.md").write_text("# gone\n")
    assert check_reference.stale_pages(docs, TIER_INFO) == [
        "checks/attic.md (no check has this area any more)", "checks/device.md"]
    assert check_reference.main(["--markdown", "--docs", str(docs)], TIER_INFO) == 0
    assert check_reference.stale_pages(docs, TIER_INFO) == [] and not (docs / "checks" / "attic.md").exists()


def _json(capsys, *argv: str) -> list[dict]:
    assert cli.main(["checks", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_lists_every_check_with_its_limits_read_from_the_data(capsys):
    listed = _json(capsys, "--json")
    from conformance.run import runrecord

    declared = runrecord.declared_controls(ROOT / "conformance" / "checks")
    assert {c["id"].removeprefix("conformance/checks/") for c in listed} == set(declared)
    by_id = {c["function"]: c for c in listed}
    gemm = by_id["test_gemm_numerics"]
    data = tomllib.loads((DATA / "devices.toml").read_text())["gemm_numerics"]["tolerance"]
    rows = gemm["limits"][0]["rows"]
    assert set(rows) == set(data) and rows["bfloat16"]["rel_fro"] == data["bfloat16"]["rel_fro"]
    assert gemm["parameters"] == ["float32", "tf32", "bfloat16", "float16", "float8"]
    assert gemm["ids"][0] == "conformance/checks/test_device.py::test_gemm_numerics[float32]"
    closed_form = by_id["test_kv_blocks_free_after_abort"]
    assert closed_form["limits"] == [] and closed_form["limits_note"] == check_limits.NO_LIMIT
    assert gemm["limits_note"] is None
    parity = tomllib.loads((DATA / "tolerances.toml").read_text())["logprobs"]
    assert by_id["test_greedy_logprobs_match_reference"]["limits"][0]["rows"]["float16"]["median"] == \
        parity["float16"]["median"]
    assert by_id["test_accuracy_meets_published_figure"]["parametrized_over"] == "task, effort in CASES"
    assert all(c["tier"] in TIER_INFO and c["catches"] and c["reference"] and c["controls"] for c in listed)


def test_tier_narrows_the_list_and_the_text_names_each_limit(capsys):
    assert {c["tier"] for c in _json(capsys, "--json", "--tier", "p2")} == {"p2"}
    assert cli.main(["checks", "--tier", "p0"]) == 0
    text = capsys.readouterr().out
    assert "test_gemm_numerics  [p0 · device]" in text and "bfloat16: rel_fro 0.005, entry 0.02" in text
    assert "[p1" not in text


def test_a_limit_changed_in_the_data_is_what_the_reference_shows(tmp_path):
    (tmp_path / "devices.toml").write_text((DATA / "devices.toml").read_text().replace(
        "bfloat16 = { rel_fro = 5e-3", "bfloat16 = { rel_fro = 7e-3"))
    table = check_limits.parse("devices.toml [gemm_numerics.tolerance.<dtype>]")[0]
    rows = {r.key: r.values for r in check_limits.resolve(table, tmp_path)}
    assert rows["bfloat16"]["rel_fro"] == 7e-3 and rows["float32"]["rel_fro"] == 1e-5


def test_limits_entries_resolve_placeholders_arrays_and_kept_keys():
    def rows(text: str) -> dict[str, dict]:
        return {r.key: r.values for r in check_limits.resolve(check_limits.parse(text)[0])}

    assert set(rows("gpt_oss.toml [tolerances.moe.<dtype>]")) == {"float32", "bfloat16", "float16"}
    assert rows("distributed.toml [collectives.<target>] busbw_floor_gbps")["cuda"] == {"busbw_floor_gbps": 10.0}
    floors = rows("devices.toml [device] floor_hbm_gbps")
    assert floors["NVIDIA H200"] == {"floor_hbm_gbps": 3210.0}
    assert rows("profiles.toml [kv_fp8.<target>.tolerance.<dtype>]") == {"cuda.bfloat16": {"p99": 2.6}}


# The plugin's metadata lint: a `Limits:` line must name tables the data has, and a check that takes the run's
# limits must have one.

def _item(doc: str, takes: str = "record_figure") -> SimpleNamespace:
    namespace: dict = {}
    exec(f"def check({takes}):\n    '''{doc}'''\n", namespace)  # a check function with this docstring
    return SimpleNamespace(iter_markers=lambda: [SimpleNamespace(name="p0")], function=namespace["check"])


FIELDS = ("Catches: x.\nReference: https://example.org\n"
          "Controls: tests/test_check_reference.py::test_limits_lint_names_a_table_the_data_lacks\n")


def test_limits_lint_names_a_table_the_data_lacks():
    assert check_metadata_problems(_item(FIELDS + "Limits: tolerances.toml [logprobs.<dtype>]\n", "tolerance")) == []
    missing = check_metadata_problems(_item(FIELDS + "Limits: tolerances.toml [logprob.<dtype>]\n"))
    assert missing == ["has a 'Limits:' entry that names tolerances.toml [logprob.<dtype>], which tolerances.toml "
                       "does not have"]
    assert "which conformance/data does not have" in check_metadata_problems(
        _item(FIELDS + "Limits: tolerance.toml [logprobs.<dtype>]\n"))[0]
    assert "is not FILE.toml [table.path]" in check_metadata_problems(_item(FIELDS + "Limits: logprobs.float32\n"))[0]


def test_limits_lint_wants_the_line_on_a_check_that_takes_the_runs_limits():
    for fixture in check_limits.LIMIT_FIXTURES:
        assert check_metadata_problems(_item(FIELDS, f"{fixture}, record_figure")) == [
            f"takes the {fixture!r} fixture but has no 'Limits:' line naming the tables it is judged by (e.g. "
            "tolerances.toml [logprobs.<dtype>])"]
    assert check_metadata_problems(_item(FIELDS)) == []


def test_every_check_of_the_suite_passes_the_limits_lint():
    for check in read_checks():
        assert check_limits.problems(check.fields.get("Limits")) == [], check.id


# The failure catalogue

def test_the_catalogue_carries_every_signature_and_every_failure_class():
    from env_checks.signatures import default_signatures

    page = failure_catalogue.catalogue_page(DOCS / "results.md")
    assert all(f"\n#### {sig.id}\n" in page for sig in default_signatures())
    classes = failure_catalogue.failure_classes(DOCS / "results.md")
    assert {"new_failure", "timeout", "crash", "could_not_run", "shared_gpu"} <= {c for _, c, _ in classes}
    assert all(f"`{klass}`" in page for _, klass, _ in classes if klass)


def test_the_catalogue_refuses_a_results_page_without_its_table(tmp_path):
    page = tmp_path / "results.md"
    page.write_text("# Reading results.json\n\n## The record\n")
    with pytest.raises(failure_catalogue.CatalogueError, match="has no section"):
        failure_catalogue.failure_classes(page)
    assert check_reference.main(["--catalogue", "--docs", str(tmp_path)], TIER_INFO) == 2


def test_citations_become_links_only_to_what_the_repository_holds():
    text = ('docs/model.md "RoPE with YaRN"; vLLM tests/models/utils.py; '
            "tests/test_check_reference.py::test_the_catalogue_refuses_a_results_page_without_its_table")
    model, here = "../" + "model.md", "../../" + "tests/test_check_reference.py"  # relative to docs/checks/
    assert check_pages.linked(text) == (
        f'[docs/model.md "RoPE with YaRN"]({model}#rope-with-yarn); vLLM tests/models/utils.py; '
        f"[tests/test_check_reference.py::test_the_catalogue_refuses_a_results_page_without_its_table]({here})")


def test_a_page_says_what_each_failure_class_its_check_names_means():
    classes = {k: m for _, k, m in failure_catalogue.failure_classes(DOCS / "results.md")}
    wanted = ("test_gemm_throughput_floor", "test_bad_request_rejected_while_serving")
    checks = [c for c in read_checks() if c.function in wanted]
    page = check_pages.pages(checks, TIER_INFO, classes)
    assert f"- `shared_gpu`: {classes['shared_gpu']}" in page["device.md"]
    assert "It may also fail as" not in page["bad-requests.md"]  # "crash" as a plain word is not the class
