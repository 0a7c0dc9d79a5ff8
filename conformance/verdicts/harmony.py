"""The harmony reference: chat requests (conformance/data/tokenizer/harmony_cases.json) rendered to token
ids by openai-harmony, built message by message from the harmony format's own rules rather than
from any server's translation code; and the verdict that compares a rendering with it.

Rules the reference encodes (docs/model.md, the harmony format guide): the system message carries
`Reasoning: low|medium|high` (medium when unset) and the conversation date; a leading system or
developer chat message becomes the developer message's instructions, tools its `functions`
namespace; history assistant answers are final-channel messages ending in <|end|>; tool calls are
commentary messages to `functions.NAME` with content type `<|constrain|>json`, ending in <|call|>;
analysis before the last final answer is dropped.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

from conformance import datafiles
from conformance.verdicts.verdict import Verdict

CASES = datafiles.DATA / "tokenizer" / "harmony_cases.json"
DATE_RE = re.compile(r"Current date: (\d{4}-\d{2}-\d{2})")


@dataclass(frozen=True)
class ChatCase:
    name: str
    messages: list[dict]
    tools: list[dict] | None = None
    reasoning_effort: str | None = None
    smoke: bool = False

    def request(self, model: str) -> dict[str, Any]:
        """The chat-completions body for this case (the server adds its date and renders it)."""
        body: dict[str, Any] = {"model": model, "messages": copy.deepcopy(self.messages)}
        if self.tools:
            body["tools"] = copy.deepcopy(self.tools)
        if self.reasoning_effort:
            body["reasoning_effort"] = self.reasoning_effort
        return body


def load_cases(smoke_only: bool = False) -> list[ChatCase]:
    data = json.loads(CASES.read_text())
    cases = [ChatCase(c["name"], c["messages"], data["tools"] if c.get("tools") else None,
                      c.get("reasoning_effort"), bool(c.get("smoke"))) for c in data["cases"]]
    return [c for c in cases if c.smoke] if smoke_only else cases


def load_encoding() -> Any:
    """openai-harmony's gpt-oss encoding (needs the vocab: run inside tokenizer.vocab.offline)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def _messages(case: ChatCase, date: str) -> list[Any]:
    from openai_harmony import (
        Author,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
    )

    system = SystemContent.new().with_conversation_start_date(date)
    if case.reasoning_effort:
        system = system.with_reasoning_effort(ReasoningEffort(case.reasoning_effort.capitalize()))
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    chat = list(case.messages)
    instructions = chat.pop(0)["content"] if chat and chat[0]["role"] in ("system", "developer") else None
    if instructions or case.tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions(instructions)
        if case.tools:
            dev = dev.with_function_tools([ToolDescription.new(
                t["function"]["name"], t["function"].get("description", ""), parameters=t["function"].get("parameters"))
                for t in case.tools])
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    call_names = {c["id"]: c["function"]["name"] for m in chat for c in m.get("tool_calls") or []}
    for m in chat:
        if m["role"] == "user":
            out.append(Message.from_role_and_content(Role.USER, m["content"]))
        elif m["role"] == "assistant":
            if m.get("reasoning"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning"]).with_channel("analysis"))
            for call in m.get("tool_calls") or []:
                out.append(Message.from_role_and_content(Role.ASSISTANT, call["function"]["arguments"])
                           .with_channel("commentary").with_recipient(f"functions.{call['function']['name']}")
                           .with_content_type("<|constrain|>json"))
            if m.get("content") and not m.get("tool_calls"):
                out.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final"))
        elif m["role"] == "tool":
            author = Author.new(Role.TOOL, f"functions.{call_names[m['tool_call_id']]}")
            out.append(Message.from_author_and_content(author, m["content"]).with_channel("commentary")
                       .with_recipient("assistant"))
        else:
            raise ValueError(f"case {case.name}: role {m['role']!r} has no harmony rule here")
    return out


def render_reference(case: ChatCase, encoding: Any, date: str) -> list[int]:
    """openai-harmony's token ids for the case, up to and including `<|start|>assistant`."""
    from openai_harmony import Conversation, Role

    conv = Conversation.from_messages(_messages(case, date))
    return list(encoding.render_conversation_for_completion(conv, Role.ASSISTANT))


def date_of(ids: list[int], encoding: Any) -> str | None:
    """The conversation date a rendering carries (the server picks it; the reference must match it)."""
    m = DATE_RE.search(encoding.decode_utf8(ids))
    return m.group(1) if m else None


def today() -> str:
    return dt.date.today().isoformat()


@dataclass
class RenderingReport(Verdict):
    """A rendering compared with the harmony reference, token by token."""

    case: str
    source: str
    got: list[int]
    want: list[int]
    problems: list[str] = field(default_factory=list)

    def failure_message(self) -> str:
        head = f"{self.case}: {self.source} vs openai-harmony rendering"
        return head + "\n  " + "\n  ".join(self.problems)


def compare_rendering(case: str, source: str, got: list[int] | None, want: list[int], encoding: Any) -> RenderingReport:
    """Equal ids, or a problem naming the first differing token with both sides decoded around it."""
    report = RenderingReport(case, source, list(got or []), want)
    if not got:
        report.problems.append(f"{source} gave no prompt token ids to compare")
        return report
    if got == want:
        return report
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))

    def around(ids: list[int]) -> str:
        return repr(encoding.decode_utf8(ids[max(0, i - 8):i]) + " ⟨" + encoding.decode_utf8(ids[i:i + 10]) + "⟩")

    report.problems.append(f"token {i} of {len(want)} (got {len(got)}) differs: {source} {around(got)} vs "
                           f"harmony {around(want)}")
    return report


@dataclass
class StopObservation:
    """What a server did when the model was made to emit `token` first (logit_bias)."""

    token: int
    finish_reason: str | None
    output_ids: list[int]


def stop_token_verdict(observed: list[StopObservation], stop: list[int], not_stop: list[int]) -> list[str]:
    """Problems: a stop token the server did not stop on, or a non-stop token it stopped on."""
    problems = []
    for o in observed:
        stopped = o.finish_reason == "stop" and o.output_ids[:1] == [o.token] and len(o.output_ids) == 1
        if o.token in stop and not stopped:
            problems.append(f"token {o.token} must end the assistant turn, but the server went on "
                            f"(finish_reason {o.finish_reason!r}, {len(o.output_ids)} tokens {o.output_ids[:6]})")
        if o.token in not_stop and (o.finish_reason == "stop" or len(o.output_ids) <= 1):
            problems.append(f"token {o.token} ends a message, not the turn, but the server stopped on it "
                            f"(finish_reason {o.finish_reason!r}, tokens {o.output_ids[:6]}): replies would be "
                            f"cut after their analysis channel")
    missing = sorted((set(stop) | set(not_stop)) - {o.token for o in observed})
    if missing:
        problems.append(f"no observation for token(s) {missing}")
    return problems
