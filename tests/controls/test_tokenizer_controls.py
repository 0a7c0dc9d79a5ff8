"""Negative controls of the tokenizer and harmony checks: broken tokenizers, broken chat templates and
broken renderings must be rejected by the same verdict code the checks use (conformance/checks/test_tokenizer.py),
and by the checks' own bodies (the offline vocabulary itself: tests/test_tokenizer_vocab.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conformance.checkpoints.tokenizer import fidelity, hf_build, vocab
from conformance.verdicts import harmony
from conformance.verdicts.compare import CheckFailed


@pytest.fixture(scope="session")
def good_dir(o200k_path: Path) -> Path:
    return hf_build.hf_tokenizer_dir(o200k_path)


def load(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@pytest.fixture(scope="session")
def good_tok(good_dir: Path):
    return load(good_dir)


def mutated(good_dir: Path, tmp_path: Path, edit) -> object:
    """A copy of the generated tokenizer with tokenizer.json changed by edit(json) -> None."""
    for name in hf_build.TOKENIZER_FILES:
        shutil.copyfile(good_dir / name, tmp_path / name)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    edit(data)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    return load(tmp_path)


def test_fidelity_passes_on_the_generated_tokenizer(good_tok, enc):
    facts = vocab.facts()
    for report in (fidelity.compare_vocabulary(good_tok, enc, int(facts["mergeable_ranks"])),
                   fidelity.compare_specials(good_tok, enc, facts),
                   fidelity.compare_corpus(good_tok, enc, fidelity.load_corpus())):
        report.raise_if_failed()


def _swap(data: dict) -> None:
    v = data["model"]["vocab"]
    v["Ġthe"], v["Ġof"] = v["Ġof"], v["Ġthe"]


def _demote(data: dict) -> None:
    merges = data["model"]["merges"]
    merges.append(merges.pop(merges.index(["a", "a"])))


@pytest.fixture(scope="module")
def broken_tok(good_dir, tmp_path_factory):
    edits = {"swapped": _swap, "demoted": _demote, "NFD": lambda d: d.update(normalizer={"type": "NFD"})}
    return {name: mutated(good_dir, tmp_path_factory.mktemp(name), edit) for name, edit in edits.items()}


def test_vocabulary_check_rejects_two_swapped_ranks(broken_tok, enc):
    report = fidelity.compare_vocabulary(broken_tok["swapped"], enc, 199998)
    assert not report.ok and len(report.problems) == 2
    with pytest.raises(CheckFailed, match="id 290"):
        report.raise_if_failed()


def test_corpus_check_rejects_a_merge_moved_to_the_end(broken_tok, enc):
    report = fidelity.compare_corpus(broken_tok["demoted"], enc, fidelity.load_corpus())
    assert not report.ok and any(p.startswith("long_repeat") for p in report.problems)


def test_corpus_check_rejects_a_normalizing_tokenizer(good_dir, tmp_path, enc):
    def nfc(data: dict) -> None:
        data["normalizer"] = {"type": "NFC"}

    report = fidelity.compare_corpus(mutated(good_dir, tmp_path, nfc), enc, fidelity.load_corpus())
    assert not report.ok and any(p.startswith("nfc_vs_nfd") for p in report.problems)


def test_specials_check_rejects_a_shifted_special_id(good_dir, tmp_path, enc):
    def shift(data: dict) -> None:
        added = {t["id"]: t for t in data["added_tokens"]}
        added[200007]["content"], added[200008]["content"] = "<|message|>", "<|end|>"

    report = fidelity.compare_specials(mutated(good_dir, tmp_path, shift), enc, vocab.facts())
    assert not report.ok
    assert any("<|end|>" in p and "[200008]" in p for p in report.problems)


def test_specials_check_rejects_a_missing_special_token(good_dir, tmp_path, enc):
    def drop(data: dict) -> None:
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|call|>"]

    report = fidelity.compare_specials(mutated(good_dir, tmp_path, drop), enc, vocab.facts())
    assert not report.ok and any("<|call|>" in p for p in report.problems)


CASES = {c.name: c for c in harmony.load_cases()}


# Chat-template mutations the harmony comparison must reject: (old text, new text, case that shows it)
TEMPLATE_BUGS = {
    "lowercase_reasoning": ("'\\n\\nReasoning: '", "'\\n\\nreasoning: '", "reasoning_low"),
    "return_in_history": ("'<|start|>assistant<|channel|>final<|message|>' ~ m.content ~ '<|end|>'",
                          "'<|start|>assistant<|channel|>final<|message|>' ~ m.content ~ '<|return|>'",
                          "multi_turn_history"),
    "constrain_dropped": ("' <|constrain|>json<|message|>'", "' json<|message|>'", "tool_call_history"),
}


def render_template(tok, template: str, case: harmony.ChatCase) -> list[int]:
    text = tok.apply_chat_template(case.messages, tools=case.tools, reasoning_effort=case.reasoning_effort,
                                   conversation_start_date="2025-08-05", add_generation_prompt=True,
                                   tokenize=False, chat_template=template)
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("bug", sorted(TEMPLATE_BUGS))
def test_template_check_rejects_a_broken_chat_template(bug, good_tok, hrm):
    old, new, case_name = TEMPLATE_BUGS[bug]
    template = hf_build.CHAT_TEMPLATE.read_text()
    assert old in template, f"the mutation {bug} no longer applies to the template"
    case = CASES[case_name]
    want = harmony.render_reference(case, hrm, "2025-08-05")
    harmony.compare_rendering(case.name, "template", render_template(good_tok, template, case), want,
                              hrm).raise_if_failed()  # the good template passes
    report = harmony.compare_rendering(case.name, "template", render_template(good_tok, template.replace(old, new),
                                                                              case), want, hrm)
    assert not report.ok
    with pytest.raises(CheckFailed, match="differs"):
        report.raise_if_failed()


@pytest.mark.parametrize("old,new,case_name", [
    ("Reasoning: low", "reasoning: low", "reasoning_low"),
    ("final<|message|>Blue.<|end|>", "final<|message|>Blue.<|return|>", "multi_turn_history"),
    ("Reasoning: high", "Reasoning: medium", "multi_turn_history"),  # reasoning_effort ignored
])
def test_server_rendering_check_rejects_a_wrong_rendering(old, new, case_name, hrm):
    """What test_server_prompt_matches_harmony does with a server's ids, on ids broken on purpose."""
    want = harmony.render_reference(CASES[case_name], hrm, "2025-08-05")
    text = hrm.decode_utf8(want)
    assert old in text
    bad = hrm.encode(text.replace(old, new), allowed_special="all")
    report = harmony.compare_rendering(case_name, "server prompt", bad, want, hrm)
    assert not report.ok and "differs" in report.problems[0]
    assert not harmony.compare_rendering(case_name, "server prompt", None, want, hrm).ok  # no ids is a failure


def test_stop_token_verdict_rejects_stopping_on_end():
    obs = harmony.StopObservation
    good = [obs(200002, "stop", [200002]), obs(200012, "stop", [200012]), obs(200007, "length", [200007] * 4)]
    assert harmony.stop_token_verdict(good, [200002, 200012], [200007]) == []
    bad = [obs(200002, "stop", [200002]), obs(200012, "length", [200012] * 4), obs(200007, "stop", [200007])]
    problems = harmony.stop_token_verdict(bad, [200002, 200012], [200007])
    assert len(problems) == 2 and "200012" in problems[0] and "200007" in problems[1]
    assert harmony.stop_token_verdict(good[:2], [200002, 200012], [200007])  # a missing observation fails


def test_vocab_check_body_fails_on_two_swapped_ranks(broken_tok, enc):
    from conformance.checks.test_tokenizer import test_tokenizer_vocab_and_specials_match_o200k_harmony as check

    with pytest.raises(CheckFailed, match="id 290"):
        check(broken_tok["swapped"], enc, vocab.facts(), lambda *a: None)


@pytest.mark.parametrize("form", ["NFD"])
def test_round_trip_smoke_body_fails_on_a_normalizing_tokenizer(form, broken_tok, enc):
    """The smoke subset now holds the NFC/NFD case: a tokenizer that decomposes text fails P0 (NFC: the corpus)."""
    from conformance.checks.test_tokenizer import test_tokenizer_round_trip_smoke as check

    with pytest.raises(CheckFailed, match="nfc_vs_nfd"):
        check(broken_tok[form], enc, lambda *a: None)


def test_corpus_check_body_fails_on_a_merge_moved_to_the_end(broken_tok, enc):
    from conformance.checks.test_tokenizer import test_tokenizer_matches_o200k_harmony_on_corpus as check

    with pytest.raises(CheckFailed, match="long_repeat"):
        check(broken_tok["demoted"], enc, lambda *a: None)


def test_harmony_stop_token_check_body_fails_on_a_library_stopping_on_end():
    from conformance.checks.test_tokenizer import test_harmony_stop_tokens_match_gpt_oss as check

    class StopsOnEnd:
        def stop_tokens_for_assistant_actions(self):
            return {200002, 200007, 200012}
    with pytest.raises(AssertionError, match=r"openai-harmony stops assistant actions on \[200002, 200007, 200012\]"):
        check(StopsOnEnd(), vocab.facts())


def test_chat_template_check_body_fails_on_lowercase_reasoning(good_tok, hrm):
    import copy

    from conformance.checks.test_tokenizer import test_chat_template_renders_harmony as check

    old, new, case_name = TEMPLATE_BUGS["lowercase_reasoning"]
    broken = copy.copy(good_tok)
    broken.chat_template = hf_build.CHAT_TEMPLATE.read_text().replace(old, new)
    with pytest.raises(CheckFailed, match="differs"):
        check(CASES[case_name], broken, hrm)


def test_openai_harmony_0_0_8_rendering_tool_calls_legacy_is_the_known_bug_on_those_two_cases_only():
    """The H200's P1 on vLLM 0.26.0 failed the two tool-call cases against openai-harmony 0.0.8, which renders the
    recipient before the channel (openai/harmony#81); oss-harmony 0.0.11 and later openai-harmony are not excused.
    Every case passes the same template against oss-harmony here (the check body, above)."""
    from conformance.run import capabilities
    from tests.check_fakes import CollectedItem

    def marked(versions: dict[str, str]) -> list[str]:
        items = [CollectedItem(f"conformance/checks/test_tokenizer.py::test_chat_template_renders_harmony[{name}]")
                 for name in CASES]
        capabilities.apply_expectations(items, {"target": "cuda", "engine": "vllm", "versions": versions})
        return [i.nodeid.split("[")[1].rstrip("]") for i in items if i.markers]

    assert marked({"openai-harmony": "0.0.8"}) == ["tool_call_history", "tool_result_pending"]
    assert marked({"oss-harmony": "0.0.11"}) == marked({"openai-harmony": "0.0.9"}) == marked({}) == []


def test_chat_template_check_body_passes_every_case_on_the_suite_s_template(good_tok, hrm):
    from conformance.checks.test_tokenizer import test_chat_template_renders_harmony as check

    for case in CASES.values():
        check(case, good_tok, hrm)
