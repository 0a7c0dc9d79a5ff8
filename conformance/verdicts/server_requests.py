"""What an OpenAI-API client is promised by the request it sends: a stop string ends the text before
it, max_tokens is exact, usage adds up and streams alike, and n choices are n separate replies, each its own.

Each probe takes a client and returns a `VerdictReport`, so a check and its negative control (a stub server with
a planted fault) run the same code. Stop strings and n are asked of /v1/completions: there the text is the
detokenized output itself, with no chat template or harmony channel parsing between the engine's stop rule and
what the client reads; max_tokens and usage are asked of both /v1/completions and /v1/chat/completions."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from conformance.engines import openai_api
from conformance.engines.vllm_server import ServerClient
from conformance.verdicts import sampling
from conformance.verdicts.compare import VerdictReport

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# the SDK type of a plain body and of a stream chunk, by endpoint; the SDK has no type for a text completion's
# chunk (it reads them as `Completion`s unvalidated: their finish_reason is null until the last)
KINDS = {COMPLETIONS: ("text_completion", None), CHAT: ("chat.completion", "chat.completion.chunk")}
PROMPT = "The quick brown fox jumps over the lazy dog. Then"
CHAT_MESSAGES = [{"role": "user", "content": "Count from one to ten."}]
SEED = 1234
STOP_WIDTHS = (2, 3)  # characters in the chosen stop string, shortest first
# stop strings sent beside the chosen one that must not stop anything: the first not in the reply is used
ABSENT_STOPS = ("#~#", "@@@", "\u00a7\u00b6\u00a7")
FINISHES = ("stop", "length")


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_text(data: Any) -> str:
    err = data.get("error") if isinstance(data, dict) else None
    return str(err.get("message") if isinstance(err, dict) else err or data)[:300]


@dataclass
class Reply:
    """One request's reply as a client reads it, per choice index (streamed: the deltas concatenated)."""

    where: str
    texts: dict[int, str] = field(default_factory=dict)
    finishes: dict[int, list[str]] = field(default_factory=dict)  # every non-null finish_reason seen
    stop_reasons: dict[int, Any] = field(default_factory=dict)  # vLLM's stop_reason, where the body has it
    token_counts: dict[int, int] = field(default_factory=dict)  # len(token_ids), where the server returns them
    usage: dict | None = None
    usage_chunks: int = 0
    ids: list[str] = field(default_factory=list)
    logprobs: dict | None = None  # choice 0's, plain /v1/completions
    draws: dict[int, dict] = field(default_factory=dict)  # per choice, plain /v1/completions: tokens and top logprobs
    problems: list[str] = field(default_factory=list)

    def bad(self, text: str) -> None:
        self.problems.append(f"{self.where}: {text}")


def _choice_text(path: str, choice: dict, streamed: bool) -> str:
    if path == COMPLETIONS:
        return choice.get("text") or ""
    return (choice.get("delta" if streamed else "message") or {}).get("content") or ""


def send(client: ServerClient, path: str, body: dict, timeout_s: float, where: str) -> Reply:
    """A plain (non-streamed) request, read choice by choice; problems if it is not a well-formed 200."""
    reply = Reply(where)
    res = client.post(path, body, timeout_s=timeout_s)
    data = res.json()
    if res.status != 200:
        reply.bad(f"HTTP {res.status}: {_error_text(data)}")
        return reply
    reply.problems += openai_api.body_problems(KINDS[path][0], data, where)
    reply.ids.append(str(data.get("id")))
    reply.usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    for choice in data.get("choices") or []:
        index = choice.get("index")
        if index in reply.texts:
            reply.bad(f"two choices have index {index}")
        reply.texts[index] = _choice_text(path, choice, False)
        reply.finishes[index] = [choice["finish_reason"]] if choice.get("finish_reason") else []
        if "stop_reason" in choice:
            reply.stop_reasons[index] = choice["stop_reason"]
        if isinstance(choice.get("token_ids"), list):
            reply.token_counts[index] = len(choice["token_ids"])
        lps = choice.get("logprobs")
        if isinstance(lps, dict):
            if index == 0:
                reply.logprobs = lps
            if isinstance(lps.get("tokens"), list) and isinstance(lps.get("top_logprobs"), list):
                reply.draws[index] = {"token_ids": lps["tokens"], "logprobs": lps["top_logprobs"]}
    return reply


def send_streamed(client: ServerClient, path: str, body: dict, timeout_s: float, where: str) -> Reply:
    """The same request streamed with stream_options.include_usage: SSE chunks of one id, [DONE] last."""
    reply = Reply(where)
    head, events = client.stream(path, body | {"stream_options": {"include_usage": True}}, timeout_s=timeout_s)
    if head.status != 200:
        reply.bad(f"HTTP {head.status}: {head.body[:300]!r}")
        return reply
    if not events or events[-1] != "[DONE]":
        reply.bad(f"the stream did not end with data: [DONE] (last event {_short(events[-1:], 100)})")
    chunks = [e for e in events if isinstance(e, dict)]
    kind = KINDS[path][1]
    reply.problems += next((bad for i, c in enumerate(chunks) if kind
                            and (bad := openai_api.body_problems(kind, c, f"{where}: chunk {i}"))), [])
    reply.ids = sorted({str(c.get("id")) for c in chunks})
    if len(reply.ids) > 1:
        reply.bad(f"the stream's chunks carry {len(reply.ids)} ids {reply.ids[:4]}, not one")
    for chunk in chunks:
        if isinstance(chunk.get("usage"), dict):
            reply.usage, reply.usage_chunks = chunk["usage"], reply.usage_chunks + 1
        for choice in chunk.get("choices") or []:
            index = choice.get("index")
            reply.texts[index] = reply.texts.get(index, "") + _choice_text(path, choice, True)
            reply.finishes.setdefault(index, [])
            if choice.get("finish_reason"):
                reply.finishes[index].append(choice["finish_reason"])
            if isinstance(choice.get("token_ids"), list):
                reply.token_counts[index] = reply.token_counts.get(index, 0) + len(choice["token_ids"])
    if reply.usage_chunks != 1:
        reply.bad(f"{reply.usage_chunks} usage chunks although stream_options.include_usage was set, not one")
    return reply


def request(path: str, model: str, **fields: Any) -> dict:
    """A request body for `path` with the suite's prompt (or chat message) and `fields`."""
    prompt = {"prompt": PROMPT} if path == COMPLETIONS else {"messages": CHAT_MESSAGES}
    return {"model": model, **prompt, **fields}


def token_boundaries(text: str, logprobs: dict | None) -> list[int] | None:
    """Where one token's text ends and the next one's begins in `text` (interior offsets), from the logprobs'
    `tokens` when they concatenate to the text, else from `text_offset`; None when neither can say."""
    logprobs = logprobs or {}
    tokens, offsets = logprobs.get("tokens"), logprobs.get("text_offset")
    ends: list[int] = []
    if isinstance(tokens, list) and tokens and "".join(map(str, tokens)) == text:
        for token in tokens:
            ends.append((ends[-1] if ends else 0) + len(token))
        starts = [0, *ends[:-1]]
    elif isinstance(offsets, list) and offsets and offsets == sorted(offsets) and offsets[-1] - offsets[0] <= len(text):
        starts = [int(o) - int(offsets[0]) for o in offsets]
    else:
        return None
    return sorted({b for b in starts if 0 < b < len(text)})


def choose_stop(text: str, boundaries: list[int]) -> tuple[str, int] | None:
    """A stop string of 2-3 characters whose FIRST occurrence in `text` straddles a token boundary, with text
    before it (so the cut reply is not empty): (the string, where it starts). Printable, not only whitespace,
    no U+FFFD; boundaries after the first token are tried first."""
    ordered = boundaries[1:] + boundaries[:1]
    for width in STOP_WIDTHS:
        for b in ordered:
            for left in range(1, width):
                start = b - left
                stop = text[start:start + width]
                if (start > 0 and len(stop) == width and stop.isprintable() and not stop.isspace()
                        and "\ufffd" not in stop and text.find(stop) == start):
                    return stop, start
    return None


def stop_strings(client: ServerClient, model: str, timeout_s: float, max_tokens: int = 16) -> VerdictReport:
    """A greedy reply, then the same request with a stop string taken from it across a token boundary (beside one
    that never occurs): plain and streamed, the text is the first reply cut before the stop string (after it with
    include_stop_str_in_output), finish_reason "stop", and the streamed text equals the plain text."""
    probe = VerdictReport("stop strings (/v1/completions)")
    base = request(COMPLETIONS, model, max_tokens=max_tokens, temperature=0, ignore_eos=True)
    first = send(client, COMPLETIONS, base | {"logprobs": 0}, timeout_s, "the reply without a stop string")
    text = first.texts.get(0)
    if first.problems or text is None:
        probe.problems += first.problems or ["the reply without a stop string has no choice 0"]
        return probe
    bounds = token_boundaries(text, first.logprobs)
    if bounds is None:
        probe.problems.append("the reply without a stop string came with no logprobs tokens or text_offset: where "
                              "its tokens meet is unknown, so no stop string across a token boundary can be chosen")
        return probe
    chosen = choose_stop(text, bounds)
    if chosen is None:
        probe.problems.append(f"no {'-'.join(map(str, STOP_WIDTHS))} character string first occurs across a token "
                              f"boundary of the reply {_short(text)} (boundaries {bounds}): nothing to stop on")
        return probe
    stop, at = chosen
    absent = next(s for s in ABSENT_STOPS if s not in text)
    probe.measured |= {"stop_string_chars": float(len(stop)), "stop_string_at_char": float(at),
                      "unconstrained_chars": float(len(text))}
    probe.details.append(f"the reply without a stop string: {_short(text)}, token boundaries at {bounds}; "
                         f"stop strings [{absent!r}, {stop!r}], the second first at character {at}")
    for include in (False, True):
        label = f"stop {stop!r}" + (" with include_stop_str_in_output" if include else "")
        body = base | {"stop": [absent, stop]} | ({"include_stop_str_in_output": True} if include else {})
        want = text[:at + (len(stop) if include else 0)]
        plain = send(client, COMPLETIONS, body, timeout_s, f"{label}, non-streamed")
        streamed = send_streamed(client, COMPLETIONS, body, timeout_s, f"{label}, streamed")
        for reply in (plain, streamed):
            probe.problems += reply.problems
            got = reply.texts.get(0)
            if not include and got is not None and stop in got:
                probe.problems.append(f"{reply.where}: the stop string is in the returned text {_short(got)}")
            elif got != want:
                probe.problems.append(f"{reply.where}: the text {_short(got)} is not the reply without a stop "
                                      f"string cut at the stop string, {_short(want)}")
            if reply.finishes.get(0) != ["stop"]:
                probe.problems.append(f"{reply.where}: finish_reason {reply.finishes.get(0)}, not ['stop']")
        if plain.stop_reasons.get(0, stop) != stop:
            probe.problems.append(f"{plain.where}: stop_reason {plain.stop_reasons[0]!r}, not the stop string")
        if plain.texts.get(0) is not None and streamed.texts.get(0) != plain.texts.get(0):
            probe.problems.append(f"{label}: the streamed text {_short(streamed.texts.get(0))} differs from the "
                                  f"non-streamed text {_short(plain.texts.get(0))}")
    return probe


def _usage_problems(reply: Reply) -> list[str]:
    usage = reply.usage
    if usage is None:
        return [] if reply.problems else [f"{reply.where}: no usage"]
    p, c, t = (usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    if not all(isinstance(v, int) for v in (p, c, t)):
        return [f"{reply.where}: usage {usage} lacks an integer prompt_tokens, completion_tokens or total_tokens"]
    out = [] if p + c == t else [f"{reply.where}: usage total_tokens {t} != prompt_tokens {p} + completion_tokens {c}"]
    counted = sum(reply.token_counts.values())
    if reply.token_counts and counted != c:
        out.append(f"{reply.where}: usage completion_tokens {c}, but {counted} token_ids came back")
    return out


def max_tokens_exact(client: ServerClient, model: str, timeout_s: float, counts: tuple[int, ...] = (1, 7)
                     ) -> VerdictReport:
    """Greedy, EOS ignored, plain and streamed, on both endpoints: exactly max_tokens tokens, finish "length"."""
    probe = VerdictReport("max_tokens via the API")
    for path in (COMPLETIONS, CHAT):
        for n in counts:
            body = request(path, model, max_tokens=n, temperature=0, ignore_eos=True, return_token_ids=True)
            for reply in (send(client, path, body, timeout_s, f"{path} max_tokens {n}, non-streamed"),
                          send_streamed(client, path, body, timeout_s, f"{path} max_tokens {n}, streamed")):
                probe.problems += reply.problems + _usage_problems(reply)
                used = (reply.usage or {}).get("completion_tokens")
                if used != n:
                    probe.problems.append(f"{reply.where}: usage.completion_tokens {used}, not max_tokens {n}")
                if reply.finishes.get(0) != ["length"]:
                    probe.problems.append(f"{reply.where}: finish_reason {reply.finishes.get(0)}, not ['length']")
            probe.measured["max_tokens_requests"] = probe.measured.get("max_tokens_requests", 0.0) + 2
    return probe


def _triple(usage: dict | None) -> tuple:
    return tuple((usage or {}).get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))


def usage_consistent(client: ServerClient, model: str, timeout_s: float, max_tokens: int = 12) -> VerdictReport:
    """A seeded sampled request on both endpoints, plain and streamed with include_usage: prompt + completion =
    total, completion_tokens = the token_ids returned, and the stream's usage and text equal the plain reply's."""
    probe = VerdictReport("usage fields")
    for path in (COMPLETIONS, CHAT):
        body = request(path, model, max_tokens=max_tokens, temperature=1.0, seed=SEED, return_token_ids=True)
        plain = send(client, path, body, timeout_s, f"{path} seed {SEED}, non-streamed")
        streamed = send_streamed(client, path, body, timeout_s, f"{path} seed {SEED}, streamed")
        for reply in (plain, streamed):
            probe.problems += reply.problems + _usage_problems(reply)
        if plain.usage is not None and streamed.usage is not None and _triple(plain.usage) != _triple(streamed.usage):
            probe.problems.append(f"{path} seed {SEED}: the streamed usage {_triple(streamed.usage)} differs from "
                                  f"the non-streamed usage {_triple(plain.usage)} (prompt, completion, total)")
        if not plain.problems and streamed.texts != plain.texts:
            probe.problems.append(f"{path} seed {SEED}: the streamed text {_short(streamed.texts)} differs from the "
                                  f"non-streamed text {_short(plain.texts)}")
        total = (plain.usage or {}).get("total_tokens")
        if isinstance(total, int):
            probe.measured[f"{'chat' if path == CHAT else 'completion'}_total_tokens"] = float(total)
    return probe


def _choices_problems(reply: Reply, n: int, max_tokens: int) -> list[str]:
    out = list(reply.problems)
    indices = sorted(reply.texts, key=str)
    if indices != list(range(n)):
        out.append(f"{reply.where}: {len(indices)} choices with indices {indices}, not {n} (indices 0..{n - 1})")
    for index in indices:
        finishes = reply.finishes.get(index, [])
        if len(finishes) != 1 or finishes[0] not in FINISHES:
            out.append(f"{reply.where}: choice {index} has finish_reason {finishes}, not one of {list(FINISHES)}")
        elif finishes[0] == "length" and reply.token_counts.get(index, max_tokens) != max_tokens:
            out.append(f"{reply.where}: choice {index} ended 'length' after {reply.token_counts[index]} of "
                       f"{max_tokens} tokens")
    return out + _usage_problems(reply)


def _unexplained_flips(alone: Reply, other: Reply, temperature: float, noise: float) -> list[str]:
    """Why `other`'s choices differ from `alone`'s where the logits did not move enough to flip those draws."""
    out = []
    for index, text in alone.texts.items():
        if other.texts.get(index) == text:
            continue
        a, b = alone.draws.get(index), other.draws.get(index)
        why = (sampling.flip_explained(a, b, temperature, noise) if a and b
               else "the reply has no logprobs to tell a flip on noise from a different draw")
        if why:
            out.append(f"choice {index} {_short(other.texts.get(index))} against {_short(text)}: {why}")
    return out


def n_choices(client: ServerClient, model: str, timeout_s: float, tol: Any, n: int = 3, requests: int = 4,
              max_tokens: int = 8) -> VerdictReport:
    """Seeded requests with n choices, each sent alone, then all at once, then the first streamed: n choices with
    indices 0..n-1, one finish_reason each, usage that counts them all, distinct response ids, the same choices
    whether a request was sent alone, among others or streamed, and not every request's choices all alike. Among
    others a kernel may compute the logits a little otherwise (bf16 on a GPU): a choice may part from the lone one
    only where its logprob gap moved enough to flip that very draw, by no more than `tol`'s noise
    (`sampling.flip_noise`)."""
    probe = VerdictReport(f"n={n} choices (/v1/completions)")
    noise, probe.judged_by["largest_flip_gap_move"] = sampling.flip_noise(tol)
    bodies = [request(COMPLETIONS, model, prompt=f"Request {i}: {PROMPT}", n=n, max_tokens=max_tokens, logprobs=5,
                      temperature=1.0, seed=SEED + i, return_token_ids=True) for i in range(requests)]
    alone = [send(client, COMPLETIONS, b, timeout_s, f"request {i} (n={n}) sent alone") for i, b in enumerate(bodies)]
    with ThreadPoolExecutor(requests) as pool:
        together = list(pool.map(lambda ib: send(client, COMPLETIONS, ib[1], timeout_s, f"request {ib[0]} (n={n}) "
                                                 f"among {requests} concurrent"), enumerate(bodies)))
    streamed = send_streamed(client, COMPLETIONS, bodies[0], timeout_s, f"request 0 (n={n}) streamed")
    for reply in (*alone, *together, streamed):
        probe.problems += _choices_problems(reply, n, max_tokens)
    flips, moved = 0, 0.0
    for i, (a, t) in enumerate(zip(alone, together)):
        if not a.problems and not t.problems:
            flips += sum(t.texts.get(k) != v for k, v in a.texts.items())
            moved = max(moved, sampling.largest_flip_move([(a.draws[k], t.draws[k]) for k in a.draws
                                                           if a.draws[k] and t.draws.get(k)], 1.0))
            probe.problems += [f"request {i} (n={n}, seed {SEED + i}) among {requests} concurrent requests: {why}"
                               for why in _unexplained_flips(a, t, 1.0, noise)]
    if not alone[0].problems and not streamed.problems and streamed.texts != alone[0].texts:
        probe.problems.append(f"request 0 (n={n}): the streamed choices {_short(streamed.texts)} differ from the "
                              f"non-streamed ones {_short(alone[0].texts)}")
    several = [set(r.texts.values()) for r in alone if len(r.texts) > 1]
    if several and all(len(texts) == 1 for texts in several):
        probe.problems.append(f"each of the {requests} requests got {n} identical choices: the choices of one request "
                              "do not draw separately (one seed for all of them?)")
    repeated = sorted(i for i, count in Counter(i for r in (*alone, *together) for i in r.ids).items() if count > 1)
    if repeated:
        probe.problems.append(f"response ids repeat across {2 * requests} requests: {repeated[:4]}")
    probe.measured |= {"n_choices": float(n), "n_requests": float(2 * requests + 1),
                      "choices_flipped_on_noise": float(flips), "largest_flip_gap_move": moved}
    return probe
