"""Session fixtures of the tokenizer, harmony and server checks: the o200k vocabulary, the model's
HF tokenizer, the tiktoken and openai-harmony references, and ONE vLLM server per session.

Without `--model`, the served model is the tiny gpt-oss with the real o200k_harmony tokenizer
(models.tiny_gpt_oss_with_tokenizer); with it, the user's checkpoint and its own tokenizer. A
server the user runs is used instead when $CONFORMANCE_SERVER_URL is set (key in
$CONFORMANCE_SERVER_API_KEY); the run then counts as platform evidence only where that server reports this
machine's vLLM release at GET /version (recorder.foreign_server_of). Where no vocabulary can be had, the checks
skip naming what is missing.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.checkpoints.tokenizer import vocab
from conformance.engines import forkserver, heartbeat, openai_api, server_fork, vllm_server
from conformance.engines.vllm_server import SERVER_KEY_ENV, SERVER_URL_ENV, ServerClient, ServerError, VllmServer
from conformance.run import capabilities
from conformance.run.run_target import RunTarget
from conformance.run.runcontext import RunContext

# The conversation date the suite's own server renders (vLLM reads it from this env var), so the
# harmony reference can be rendered without guessing the server's clock.
SERVER_DATE = "2025-08-05"
# Keys of the engine env that do not apply to a server: its engine core is always a child process.
NOT_FOR_SERVER = ("VLLM_ENABLE_V1_MULTIPROCESSING",)


@pytest.fixture(scope="session")
def o200k_vocab(run: RunContext) -> Path:
    """The verified o200k_base.tiktoken (rebuilt from quicktok-v1, or $CONFORMANCE_TOKENIZER_VOCAB). A wrong
    vocabulary (sha256 mismatch) or none at all fails the checks that need it: never a skip, which would let
    P0 pass without its tokenizer checks."""
    run.phases.wait_built("o200k")  # built in the background from collection on (phases.py)
    try:
        return vocab.ensure_o200k()
    except vocab.VocabUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def tokenizer_facts() -> dict:
    return vocab.facts()


@pytest.fixture(scope="session")
def o200k_harmony(o200k_vocab: Path) -> Any:
    """tiktoken's o200k_harmony encoding, read from the local vocabulary (the fidelity reference)."""
    with vocab.offline(o200k_vocab.parent):
        import tiktoken

        return tiktoken.get_encoding("o200k_harmony")


@pytest.fixture(scope="session")
def harmony_encoding(o200k_vocab: Path) -> Any:
    """openai-harmony's gpt-oss encoding (the rendering reference)."""
    from conformance.verdicts.harmony import load_encoding

    with vocab.offline(o200k_vocab.parent):
        return load_encoding()


@pytest.fixture(scope="session")
def model_tokenizer_dir(run: RunContext, o200k_vocab: Path) -> Path:
    """The directory of the HF tokenizer under test: the user's model, or the generated o200k one."""
    if run.model_arg:
        path = Path(run.model_arg)
        if not (path / "tokenizer.json").is_file():
            pytest.skip(f"{path} has no tokenizer.json: there is no HF tokenizer to compare")
        return path
    from conformance.checkpoints.tokenizer.hf_build import hf_tokenizer_dir

    return hf_tokenizer_dir(o200k_vocab)


@pytest.fixture(scope="session")
def hf_tokenizer(model_tokenizer_dir: Path) -> Any:
    """The HF tokenizer as vLLM loads it (transformers' AutoTokenizer, offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_tokenizer_dir), local_files_only=True)


@dataclass
class ServedModel:
    name: str
    path: Path


def _served_model(run: RunContext, vocab_path: Path) -> ServedModel:
    if run.model_arg:
        return ServedModel(Path(run.model_arg).name or "model", Path(run.model_arg))
    from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer

    return ServedModel("tiny-gpt-oss-o200k", tiny_gpt_oss_with_tokenizer(vocab_path=vocab_path).path)


@pytest.fixture(scope="session")
def served_model(run: RunContext, o200k_vocab: Path) -> ServedModel:
    run.phases.wait_built("tiny-tok")
    return _served_model(run, o200k_vocab)


# The suite's server takes ~30 s to start on two cores: when checks will need it, it is started in a
# background thread as the session begins, overlapping the engine and device checks (plugin.py); its state is the
# run's (RunContext.prestart).
def prestart_server(run: RunContext) -> None:
    has_server = capabilities.declared().has(run.engine, "server")  # data/engines.toml
    if os.environ.get(SERVER_URL_ENV) or not has_server or run.resolved().problems:
        return
    pre = run.prestart

    def start() -> None:
        try:
            for built in ("o200k", "tiny-tok"):  # the background builds (phases.py), not a second build
                run.phases.wait_built(built)
            ready = run.phases.forkserver_ready()  # a forked server would wait for its imports anyway: so
            if ready is not None:                  # its start_seconds is its own start, not theirs
                ready.wait(run.target.timeouts.engine_start_s)
                forkserver.wait_inspected()  # its engine core reads vLLM's model inspection from the cache
            vocab_path = vocab.ensure_o200k()
            with pre.lock:  # an interrupted run discards it first: then no server is launched at all
                if pre.discarded or run.stopping.is_set():
                    return
                proc = new_server(run.target, _served_model(run, vocab_path), vocab_path.parent,
                                  run.run_dir / "vllm-server.log")
                pre.proc = proc  # so an interrupted run can stop it while it is still starting
            with heartbeat.phase("vLLM server start (in the background)", proc.log_path, every=0):
                pre.server = proc.start()
        except BaseException as exc:  # noqa: BLE001 - the fixture starts it again and reports properly
            pre.error = exc

    pre.thread = threading.Thread(target=start, name="server-prestart", daemon=True)
    pre.thread.start()


def discard_prestarted(run: RunContext) -> None:
    """Stop a prestarted server no check took (an interrupted run); it lives in its own process group."""
    pre = run.prestart
    with pre.lock:
        proc, started = pre.proc, pre.thread is not None
        pre.proc = pre.thread = pre.server = None
        pre.discarded = True  # the background thread, still waiting, launches nothing now
    if proc is not None and started:
        proc.close(grace_s=min(10.0, vllm_server.CLOSE_GRACE_S))  # still starting or started: stopped either way


def _take_prestarted(run: RunContext) -> VllmServer | None:
    pre = run.prestart
    thread, pre.thread = pre.thread, None
    if thread is None:
        return None
    if thread.is_alive():
        with heartbeat.phase("waiting for the vLLM server started in the background",
                             getattr(pre.proc, "log_path", None)):
            thread.join()
    server, pre.proc, pre.server = pre.server, None, None  # taken: the fixture closes it
    return server


@dataclass
class ServerUnderTest:
    """A server being tested: its client, the model name to ask for, and what the suite knows of it."""

    client: ServerClient
    model: str
    api_key: str | None
    managed: bool  # started by the suite (so its settings and date are known)
    start_seconds: float | None
    date: str | None
    log_path: Path | None


def external_server(url: str, api_key: str | None = None) -> ServerUnderTest:
    """A server the user runs, at its root URL or its SDK base URL (`.../v1`); ServerError (one sentence) when
    it cannot be reached or used."""
    client = ServerClient(openai_api.server_root(url), api_key)
    models = client.get("/v1/models")
    if models.status != 200:
        raise ServerError(f"the server at {url} answered /v1/models with HTTP {models.status}: check it, and "
                          f"{SERVER_KEY_ENV} (or {openai_api.API_KEY_ENV}) if it needs a key.")
    data = models.json().get("data") or [{}]
    return ServerUnderTest(client, str(data[0].get("id")), api_key, False, None, None, None)


def reported_vllm(client: ServerClient) -> str | None:
    """The vLLM version a server reports at GET /version (vLLM's OpenAI server), or None where it reports none."""
    try:
        reply = client.get("/version")
        version = reply.json().get("version") if reply.status == 200 else None
    except (ServerError, ValueError, AttributeError):
        return None
    return str(version) if version else None


def new_server(target: RunTarget, model: ServedModel, vocab_dir: Path, log_path: Path) -> VllmServer:
    """A vLLM server for the model under the target's engine settings, the run's profile and its backend row (not
    started yet), with a fresh key. First contact on the H200 in fp16: the server, left on vLLM's own attention
    choice (FlashAttention 3, bf16 sinks only) while the engines ran the profile's TRITON_ATTN row, died at its
    first request ("We only support bf16 dtype for S aux")."""
    # the server serves as the engines do: the same options, profile row and environment
    options = target.process_options("vllm")
    env = {k: v for k, v in target.process_env("vllm").items() if k not in NOT_FOR_SERVER}
    env |= vocab.vocab_env(vocab_dir) | {"VLLM_SYSTEM_START_DATE": SERVER_DATE}
    fork_ctx, fork_env = server_fork.context_for(target.table)  # forked from the forkserver
    return VllmServer(str(model.path), model.name, options, env | fork_env, log_path,
                      start_timeout_s=target.timeouts.engine_start_s, api_key=secrets.token_hex(16),
                      fork_ctx=fork_ctx)


@pytest.fixture(scope="session")
def server(run: RunContext, request: pytest.FixtureRequest) -> Iterator[ServerUnderTest]:
    """The OpenAI-compatible server under test, started once per session (or the user's)."""
    url = os.environ.get(SERVER_URL_ENV)
    if url:
        try:
            user_server = external_server(url, openai_api.server_api_key(os.environ))
        except ServerError as exc:
            pytest.fail(str(exc), pytrace=False)
        run.external_server = {"vllm": reported_vllm(user_server.client)}
        yield user_server
        return
    capabilities.require(run.target, "server")  # data/engines.toml
    target = run.resolved()
    if target.problems:
        pytest.fail(f"cannot start the server: {target.sentence()}", pytrace=False)
    model: ServedModel = request.getfixturevalue("served_model")
    vocab_dir = request.getfixturevalue("o200k_vocab").parent
    proc = _take_prestarted(run)
    if proc is None:
        proc = new_server(run.target, model, vocab_dir, run.run_dir / "vllm-server.log")
        factory = run.engine_factory
        if factory is not None:  # the server's share of the device beside the engines alive
            factory.hold("vllm-server", factory.share_of(proc.options))
        try:
            with heartbeat.phase("vLLM server start", proc.log_path):
                proc.start()
        except ServerError as exc:
            pytest.fail(str(exc), pytrace=False)
        # forked from the forkserver (targets.toml server_start), or fresh after a forked start died
        run.startups.append(("vLLM server" + (" (fresh: its forked start died)" if proc.forked_start_failed else
                                              " (forked)" if proc.fork_ctx is not None else ""), proc.start_seconds))
    else:
        run.startups.append(("vLLM server (started in the background)", proc.start_seconds))
    run.phases.add_vllm_start(proc.log_path)
    try:
        yield ServerUnderTest(proc.client(), model.name, proc.api_key, True, proc.start_seconds, SERVER_DATE,
                              proc.log_path)
    finally:
        proc.close()
        if run.engine_factory is not None:
            run.engine_factory.hold("vllm-server", None)


@pytest.fixture(scope="session")
def server_call_timeout_s(run: RunContext) -> float:
    return run.target.timeouts.engine_call_s
