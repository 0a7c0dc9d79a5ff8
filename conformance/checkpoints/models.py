"""Deterministic tiny gpt-oss checkpoints, generated on first use and cached by content hash.

The tiny model keeps every architectural feature of gpt-oss (docs/model.md): alternating
sliding(128)/full attention, attention sinks, YaRN RoPE with the real parameters, top-4 MoE
with the clamped interleaved SwiGLU, attention and expert biases, an untied lm_head, and
head_dim 64 with every dimension a multiple of 32. Weights are random from a fixed seed and
scaled so that logits are decisive and the SwiGLU clamp is actually reached; with the usual
0.02 init every mistake in the math would hide inside a near-flat distribution.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from conformance.checkpoints import gptoss_config
from conformance.datafiles import cache_root, content_hash

# Bumped whenever the generator changes what it writes, so old caches are not reused.
GENERATOR_VERSION = 1
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class TinySpec:
    """The knobs of a tiny checkpoint; everything else is the real gpt-oss config."""

    num_hidden_layers: int = 4
    hidden_size: int = 128
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    num_local_experts: int = 8
    num_experts_per_tok: int = 4
    vocab_size: int = 4096
    sliding_window: int = 128
    seed: int = 20250805
    dtype: str = "float32"

    def key(self) -> str:
        blob = json.dumps({"spec": asdict(self), "generator": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def hf_config(spec: TinySpec) -> dict:
    """config.json as the real gpt-oss checkpoints write it (rope_scaling + rope_theta)."""
    return {
        "architectures": gptoss_config.spec()["shared"]["architectures"],
        "model_type": "gpt_oss",
        "num_hidden_layers": spec.num_hidden_layers,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "num_local_experts": spec.num_local_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "experts_per_token": spec.num_experts_per_tok,
        "vocab_size": spec.vocab_size,
        "sliding_window": spec.sliding_window,
        "layer_types": [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(spec.num_hidden_layers)
        ],
        "rope_theta": 150000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        "max_position_embeddings": 131072,
        "initial_context_length": 4096,
        "swiglu_limit": 7.0,
        "rms_norm_eps": 1e-5,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "use_cache": True,
        "eos_token_id": spec.vocab_size - 2,
        "pad_token_id": spec.vocab_size - 1,
        "torch_dtype": spec.dtype,
        "dtype": spec.dtype,
    }


def _weights(spec: TinySpec) -> dict:
    import torch

    gen = torch.Generator().manual_seed(spec.seed)

    def normal(*shape: int, std: float, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean

    h, e, inter = spec.hidden_size, spec.num_local_experts, spec.intermediate_size
    q_dim = spec.num_attention_heads * spec.head_dim
    kv_dim = spec.num_key_value_heads * spec.head_dim
    w: dict = {"model.embed_tokens.weight": normal(spec.vocab_size, h, std=1.0)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        # q.k/sqrt(d) has a std of about 2: attention is peaked, so window and sinks matter.
        for name, out_dim in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            w[p + f"self_attn.{name}.weight"] = normal(out_dim, h, std=1.5 / h**0.5)
            w[p + f"self_attn.{name}.bias"] = normal(out_dim, std=0.3)
        w[p + "self_attn.o_proj.weight"] = normal(h, q_dim, std=1.0 / q_dim**0.5)
        w[p + "self_attn.o_proj.bias"] = normal(h, std=0.1)
        w[p + "self_attn.sinks"] = normal(spec.num_attention_heads, std=1.0)
        w[p + "mlp.router.weight"] = normal(e, h, std=2.0 / h**0.5)
        w[p + "mlp.router.bias"] = normal(e, std=0.5)
        # gate/up pre-activations with std ~4, so the clamp at 7 is reached on some units.
        w[p + "mlp.experts.gate_up_proj"] = normal(e, h, 2 * inter, std=4.0 / h**0.5)
        w[p + "mlp.experts.gate_up_proj_bias"] = normal(e, 2 * inter, std=0.5)
        w[p + "mlp.experts.down_proj"] = normal(e, inter, h, std=0.5 / inter**0.5)
        w[p + "mlp.experts.down_proj_bias"] = normal(e, h, std=0.1)
    w["model.norm.weight"] = normal(h, std=0.1, mean=1.0)
    w["lm_head.weight"] = normal(spec.vocab_size, h, std=3.0 / h**0.5)
    torch_dtype = getattr(torch, spec.dtype)
    return {k: v.to(torch_dtype).contiguous() for k, v in w.items()}


def write_checkpoint(spec: TinySpec, out_dir: Path, config_overrides: dict | None = None,
                     weight_transform: Callable[[dict], dict] | None = None) -> Path:
    """Write the tiny checkpoint to out_dir; config overrides and weight transforms make crafted
    checkpoints (extreme sinks) and known-bad stacks for negative controls."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(spec) | (config_overrides or {})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"]})
    )
    weights = _weights(spec)
    if weight_transform is not None:
        weights = weight_transform(weights)
    save_file(weights, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    return out_dir


@dataclass(frozen=True)
class TinyModel:
    path: Path
    spec: TinySpec
    content_hash: str


def tiny_gpt_oss(spec: TinySpec | None = None, root: Path | None = None) -> TinyModel:
    """Return the cached tiny checkpoint for spec, generating it atomically if absent or damaged."""
    spec = spec or TinySpec()
    root = root or cache_root()
    final = root / f"tiny-gpt-oss-{spec.key()}"
    stamp = final / "content_hash"
    if stamp.is_file() and (final / WEIGHTS_FILE).is_file():
        recorded = stamp.read_text().strip()
        if content_hash(final) == recorded:
            return TinyModel(final, spec, recorded)
        shutil.rmtree(final)  # damaged cache: regenerate rather than test a corrupt model
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=root))
    write_checkpoint(spec, tmp)
    digest = content_hash(tmp)
    (tmp / "content_hash").write_text(digest + "\n")
    try:
        os.replace(tmp, final)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return TinyModel(final, spec, digest)


def with_spec(**changes: object) -> TinySpec:
    return replace(TinySpec(), **changes)


# --- The tiny gpt-oss with the real o200k_harmony tokenizer (appended: the code above is unchanged) ---
# The real 201088-token vocabulary with small dims keeps the checkpoint near 50 MB in bf16; two
# layers still alternate sliding/full attention. It is what the server and harmony checks serve.
TOKENIZER_SPEC = TinySpec(num_hidden_layers=2, hidden_size=64, intermediate_size=64, num_attention_heads=2,
                          num_key_value_heads=1, vocab_size=201088, dtype="bfloat16")


def tiny_gpt_oss_with_tokenizer(spec: TinySpec = TOKENIZER_SPEC, root: Path | None = None,
                                vocab_path: Path | None = None) -> TinyModel:
    """The cached tiny gpt-oss whose directory also holds the generated o200k_harmony HF tokenizer.

    Special ids follow docs/model.md (eos <|return|> 200002, pad <|endoftext|> 199999) and
    generation_config.json lists the real model's eos ids, which is where vLLM takes the stop
    tokens 200002 and 200012 from. Raises tokenizer.vocab.VocabUnavailable without a vocabulary."""
    from conformance.checkpoints.tokenizer import hf_build, vocab

    facts = vocab.facts()
    if spec.vocab_size != int(facts["vocab_size"]):
        raise ValueError(f"a tokenizer model needs vocab_size {facts['vocab_size']}, not {spec.vocab_size}")
    vocab_path = vocab_path or vocab.ensure_o200k()
    tok_dir = hf_build.hf_tokenizer_dir(vocab_path)
    root = root or cache_root()
    final = root / f"tiny-gpt-oss-tok-{spec.key()}-{tok_dir.name.rsplit('-', 1)[-1]}"
    stamp = final / "content_hash"
    if stamp.is_file() and (final / WEIGHTS_FILE).is_file():
        recorded = stamp.read_text().strip()
        if content_hash(final) == recorded and all((final / f).is_file() for f in hf_build.TOKENIZER_FILES):
            return TinyModel(final, spec, recorded)
        shutil.rmtree(final)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-tok-", dir=root))
    eos, pad = int(facts["eos_token_id"]), int(facts["pad_token_id"])
    write_checkpoint(spec, tmp, config_overrides={"eos_token_id": eos, "pad_token_id": pad,
                                                  "bos_token_id": 199998})
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 199998, "eos_token_id": [eos, pad, 200012], "pad_token_id": pad}, indent=2))
    for name in hf_build.TOKENIZER_FILES:
        shutil.copyfile(tok_dir / name, tmp / name)
    digest = content_hash(tmp)
    (tmp / "content_hash").write_text(digest + "\n")
    os.chmod(tmp, 0o755)
    try:
        os.replace(tmp, final)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return TinyModel(final, spec, digest)
