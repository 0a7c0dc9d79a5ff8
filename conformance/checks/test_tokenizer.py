"""Tokenizer fidelity and chat rendering: the model's HF tokenizer against tiktoken's o200k_harmony,
and its chat template against openai-harmony's rendering (no engine needed)."""

import pytest

from conformance.checkpoints.tokenizer import fidelity
from conformance.verdicts import harmony
from conformance.verdicts.verdict import fail, record_figures

AREA = "tokenizer"
CASES = harmony.load_cases()


@pytest.mark.p0
def test_tokenizer_vocab_and_specials_match_o200k_harmony(hf_tokenizer, o200k_harmony, tokenizer_facts,
                                                          record_figure):
    """Every id of the model's HF tokenizer names the same bytes as tiktoken's o200k_harmony, the vocab
    size is 201088 and the special tokens sit on the ids of docs/model.md (199998 … 200012, reserved to 201087).

    Catches: a tokenizer.json with swapped or shifted ranks, a special token on the wrong id (prompts
    rendered with <|end|> where the model was trained on <|message|>), a truncated or padded vocab,
    eos/pad ids that do not match the model.
    Reference: docs/model.md "Tokenizer: o200k_harmony"; tiktoken_ext/openai_public.py o200k_harmony
    Controls: tests/controls/test_tokenizer_controls.py::test_vocab_check_body_fails_on_two_swapped_ranks
    """
    reports = [fidelity.compare_vocabulary(hf_tokenizer, o200k_harmony, int(tokenizer_facts["mergeable_ranks"])),
               fidelity.compare_specials(hf_tokenizer, o200k_harmony, tokenizer_facts)]
    for report in reports:
        record_figures(record_figure, report)
    for report in reports:
        report.raise_if_failed()


@pytest.mark.p0
def test_tokenizer_round_trip_smoke(hf_tokenizer, o200k_harmony, record_figure):
    """The smoke subset of the hard-string corpus encodes to tiktoken's ids and decodes back exactly.

    Catches: a wrong pre-tokenizer regex (whitespace runs, digits split differently), a normalizer
    that rewrites text, decode clean-up that changes spaces, specials in text not recognised.
    Reference: docs/model.md "Tokenizer: o200k_harmony"; https://github.com/openai/tiktoken
    Controls: tests/controls/test_tokenizer_controls.py::test_round_trip_smoke_body_fails_on_a_normalizing_tokenizer
    """
    report = fidelity.compare_corpus(hf_tokenizer, o200k_harmony, fidelity.load_corpus(smoke_only=True))
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.mark.p1
def test_tokenizer_matches_o200k_harmony_on_corpus(hf_tokenizer, o200k_harmony, record_figure):
    """Every string of the corpus (whitespace runs, CJK, emoji and ZWJ sequences, digits, code,
    combining marks, control characters, lone surrogates, special tokens) gives tiktoken's ids, round
    trips, and every prefix of its ids decodes as tiktoken decodes it (U+FFFD where a character is split).

    Catches: tokenizer divergences that only show on unusual text — and so only in production —
    such as NFC normalisation, a byte-fallback difference, ZWJ handling, lone-surrogate crashes that
    return other ids, and incremental detokenisation that emits broken characters.
    Reference: docs/model.md "Tokenizer: o200k_harmony"; tiktoken/core.py (encode, decode)
    Controls: tests/controls/test_tokenizer_controls.py::test_corpus_check_body_fails_on_a_merge_moved_to_the_end
    """
    report = fidelity.compare_corpus(hf_tokenizer, o200k_harmony, fidelity.load_corpus())
    record_figures(record_figure, report)
    record_figure("corpus_refused", len(report.refused))
    report.raise_if_failed()


@pytest.mark.p1
def test_harmony_stop_tokens_match_gpt_oss(harmony_encoding, tokenizer_facts):
    """openai-harmony's stop tokens for assistant actions are <|return|> 200002 and <|call|> 200012.

    Catches: a harmony library whose stop set includes <|end|> 200007 (replies cut after the analysis
    channel) or lacks <|call|> (tool calls run on into garbage) — the reference the server is judged by.
    Reference: docs/model.md "Tokenizer: o200k_harmony" (stop tokens); https://github.com/openai/harmony
    Controls:
      tests/controls/test_tokenizer_controls.py::test_harmony_stop_token_check_body_fails_on_a_library_stopping_on_end
    """
    got = sorted(harmony_encoding.stop_tokens_for_assistant_actions())
    if got != sorted(tokenizer_facts["stop_tokens"]):
        fail(f"openai-harmony stops assistant actions on {got}, docs/model.md says {tokenizer_facts['stop_tokens']}")


@pytest.mark.p1
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_chat_template_renders_harmony(case, hf_tokenizer, harmony_encoding):
    """The model's chat template, applied by transformers, gives the same token ids as openai-harmony.

    Catches: templates that write `reasoning: low` instead of `Reasoning: low`, keep <|return|> on
    history turns instead of <|end|>, drop `<|constrain|>json` from tool calls, or misplace the
    developer instructions — prompts the model never saw in training.
    Reference: docs/model.md "Tokenizer: o200k_harmony" (known mismatches); https://github.com/openai/harmony/issues/91
    Controls: tests/controls/test_tokenizer_controls.py::test_chat_template_check_body_fails_on_lowercase_reasoning
    """
    if not getattr(hf_tokenizer, "chat_template", None):
        pytest.skip("the model's tokenizer has no chat template")
    date = harmony.today()
    text = hf_tokenizer.apply_chat_template(case.messages, tools=case.tools, reasoning_effort=case.reasoning_effort,
                                            conversation_start_date=date, add_generation_prompt=True,
                                            tokenize=False)
    got = hf_tokenizer.encode(text, add_special_tokens=False)
    want = harmony.render_reference(case, harmony_encoding, harmony.date_of(got, harmony_encoding) or date)
    harmony.compare_rendering(case.name, "chat template", got, want, harmony_encoding).raise_if_failed()
