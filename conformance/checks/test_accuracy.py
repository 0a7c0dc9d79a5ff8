"""P3 accuracy: the served gpt-oss run through lm-eval on gsm8k, GPQA Diamond and AIME (local copies of
the datasets), scored against the published figures of the model by the rule in data/accuracy.toml, at
each reasoning effort, after verifying that effort reaches the prompt."""

import json
import os
from pathlib import Path

import pytest

from conformance.engines import server_fork
from conformance.engines.vllm_server import SERVER_URL_ENV
from conformance.verdicts import accuracy
from conformance.verdicts.verdict import fail, record_figures

AREA = "accuracy"
CASES = accuracy.cases()
RUN_TIMEOUT_S = accuracy.lm_eval_settings().run_timeout_s


def _published_model(target) -> str | None:
    """The published model the --model checkpoint is; None when a user's server is to be asked its name;
    otherwise a skip that says what is missing."""
    if not target.model:
        if os.environ.get(SERVER_URL_ENV):
            return None
        pytest.skip("P3 accuracy needs the real gpt-oss weights (--model DIR with gpt-oss-120b or gpt-oss-20b, or "
                    "--server URL serving one); the tiny model's scores mean nothing")
    path = Path(target.model) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        fail(f"{path} cannot be read as JSON: --model must be a checkpoint directory")
    model = accuracy.identify_model(config, None)
    if model is None:
        pytest.skip(f"no published figures for this model (model_type {config.get('model_type')}, "
                    f"{config.get('num_hidden_layers')} layers, {config.get('num_local_experts')} experts); "
                    "accuracy.toml [models] knows " + ", ".join(accuracy.accuracy_data()["models"]))
    return model


@pytest.mark.p3
@pytest.mark.timeout(RUN_TIMEOUT_S + 600)
@pytest.mark.parametrize(("task", "effort"), CASES, ids=[f"{t}-{e}" for t, e in CASES])
def test_accuracy_meets_published_figure(task, effort, target, run_dir, server_call_timeout_s, record_figure,
                                        request):
    """lm-eval's score of the served model on this task at this reasoning effort is at or above the
    pass mark derived from the published figure (accuracy.toml [rule]: reference - 0.05, vLLM's CI
    rule), and the server rendered `Reasoning: <effort>` into the prompt it fed the model.

    Catches: accuracy lost on the real model where every numeric check on the tiny one passes — MoE
    kernel or padding regressions at TP>1 (gsm8k 0.9 -> 0.68), providers scoring 80 instead of 93 on
    AIME25, and a reasoning effort silently ignored (docs/failure-modes.md, mode 10).
    Reference: docs/figures.md "Reference figures"; https://github.com/EleutherAI/lm-evaluation-harness
    Limits: accuracy.toml [rule]; accuracy.toml [reference.<model>.<task>]
    Controls:
      tests/controls/test_accuracy_controls.py::test_accuracy_check_fails_on_a_model_dir_without_a_readable_config
    """
    model = _published_model(target)
    spec = accuracy.tasks()[task]
    data_dir = accuracy.eval_data_dir()
    if data_dir is None:
        pytest.skip(f"no eval data: set ${accuracy.EVAL_DATA_ENV} to a directory holding "
                    + " and ".join(f"{split}: {paths[0]}" for split, paths in spec.files.items()))
    files, missing = accuracy.resolve_files(spec, data_dir)
    if missing:
        pytest.skip(f"{data_dir} lacks the {'; '.join(missing)}")
    try:
        accuracy.lm_eval_tasks_dir()
    except accuracy.AccuracyError as exc:
        pytest.skip(str(exc))
    server = request.getfixturevalue("server")
    if model is None:
        model = accuracy.identify_model(None, server.model)
        if model is None:
            pytest.skip(f"no published figures for the served model {server.model!r} (accuracy.toml [models])")
    reference = accuracy.reference_figure(model, task, effort)
    if reference is None:
        pytest.skip(f"no published {task} figure for {model} at reasoning effort {effort} (accuracy.toml)")

    accuracy.effort_rendered(server.client, server.model, effort, server_call_timeout_s).raise_if_failed()
    out_dir = run_dir / "accuracy" / f"{task}-{effort}"
    try:
        score = accuracy.run_lm_eval(accuracy.lm_eval_settings(), server.client.base_url, server.model,
                                     server.api_key, spec, effort, files, out_dir,
                                     server_fork.client_context(target.table))
    except accuracy.AccuracyError as exc:
        fail(str(exc))
    verdict = accuracy.accuracy_verdict(score, reference, accuracy.pass_rule())
    record_figures(record_figure, verdict)
    verdict.raise_if_failed()
