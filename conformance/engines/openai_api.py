"""The openai SDK's conventions for the server under test: where it is, its key, and the shape of its answers.

- Where: `--server` takes a base URL with or without the trailing `/v1` (the SDK's `base_url` has it, e.g.
  `http://host:8000/v1`); the suite keeps the server's root and adds `/v1/...` once. `--server` alone reads
  `$OPENAI_BASE_URL`.
- Key: `$CONFORMANCE_SERVER_API_KEY`, else the SDK's `$OPENAI_API_KEY` (vLLM's documented placeholder for a
  server without a key, `EMPTY`, counts as none).
- Shape: a happy-path body is validated with the SDK's own pydantic types (`ChatCompletion`,
  `ChatCompletionChunk`, `Completion`, `Response`); the openai package ships with every vLLM install.
  A problem names the field: `choices.0.message.content: Input should be a valid string (got 5)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from conformance.engines.vllm_server import SERVER_KEY_ENV, ServerError

BASE_URL_ENV = "OPENAI_BASE_URL"
API_KEY_ENV = "OPENAI_API_KEY"
FROM_ENV = "$OPENAI_BASE_URL"  # the value of a bare `--server`
NO_KEY = ("", "EMPTY")
MAX_FIELD_PROBLEMS = 3

# the `object` of each body -> (module, class) of the openai SDK type that describes it
BODY_TYPES = {
    "chat.completion": ("openai.types.chat", "ChatCompletion"),
    "chat.completion.chunk": ("openai.types.chat", "ChatCompletionChunk"),
    "text_completion": ("openai.types", "Completion"),
    "response": ("openai.types.responses", "Response"),
}


def server_root(url: str) -> str:
    """The server's root URL: `http://h:8000/v1/` and `http://h:8000` both give `http://h:8000` (a path
    prefix before /v1, such as a proxy's, is kept). ServerError (one sentence) for what is not an http(s) URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(f"{url!r} is not an http(s) URL: give the server as http://HOST:PORT or "
                          "http://HOST:PORT/v1.")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_url(option: str | None, environ: Mapping[str, str]) -> str | None:
    """The root URL the `--server` option names (None: none given); a bare `--server` reads $OPENAI_BASE_URL."""
    if option is None:
        return None
    if option == FROM_ENV:
        option = environ.get(BASE_URL_ENV, "").strip()
        if not option:
            raise ServerError(f"--server without a URL reads ${BASE_URL_ENV}, which is not set: give "
                              "--server http://HOST:PORT/v1 or set it.")
    return server_root(option)


def server_api_key(environ: Mapping[str, str]) -> str | None:
    """The key for the user's server: $CONFORMANCE_SERVER_API_KEY, else $OPENAI_API_KEY (EMPTY = none)."""
    for name in (SERVER_KEY_ENV, API_KEY_ENV):
        value = environ.get(name, "").strip()
        if value not in NO_KEY:
            return value
    return None


@cache
def _model_class(kind: str) -> Any:
    import importlib

    module, name = BODY_TYPES[kind]
    return getattr(importlib.import_module(module), name)


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def body_problems(kind: str, body: Any, where: str = "") -> list[str]:
    """What in `body` does not match the SDK type of `kind` (a BODY_TYPES key): one line per field, at most
    MAX_FIELD_PROBLEMS and a count of the rest. Fail closed: no openai package is a problem too."""
    prefix = f"{where}: " if where else ""
    try:
        model = _model_class(kind)
    except ImportError as exc:
        return [f"{prefix}cannot check the body against the openai SDK's types: {exc} (install the openai "
                "package, which vLLM depends on)"]
    import pydantic

    try:
        model.model_validate(body)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        head = f"{prefix}not an openai {model.__name__}: "
        lines = [f"{head}{'.'.join(_short(str(p), 40) for p in e['loc']) or '(body)'}: {_short(e['msg'])} "
                 f"(got {_shown(e.get('input'))})" for e in errors[:MAX_FIELD_PROBLEMS]]
        if len(errors) > MAX_FIELD_PROBLEMS:
            lines.append(f"{head}and {len(errors) - MAX_FIELD_PROBLEMS} more fields")
        return lines
    return []
