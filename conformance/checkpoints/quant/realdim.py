"""A gpt-oss checkpoint with the published model's real dimensions (hidden 2880, 64/8 heads of 64, 128 or 32
experts, the 201088-token vocab) but only a few layers and random weights, written layer by layer in the real
on-disk layout: MXFP4 expert blocks and scales as u8 [E, out, in/32, 16] / [E, out, in/32], everything else
bf16, one safetensors shard per layer. For P0 at the real size without downloading a model:
`python -m conformance.checkpoints.quant.realdim OUT_DIR --layers 2 --variant gpt-oss-120b`."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from conformance.checkpoints import gptoss_config
from conformance.checkpoints.quant.mxfp4 import NOT_CONVERTED

E2M1_RMS_LOG2 = 1.5  # log2 of the RMS of uniformly random E2M1 codes (~2.9)


def real_config(variant: str, layers: int) -> dict:
    spec = gptoss_config.spec()
    shared, dims = spec["shared"], spec["variants"][variant]
    cfg = {k: v for k, v in shared.items() if k not in ("rope_scaling", "architectures")} | dict(dims)
    cfg.pop("params_billion", None)
    cfg |= {"architectures": shared["architectures"], "num_hidden_layers": layers,
            "rope_scaling": dict(shared["rope_scaling"]), "experts_per_token": shared["num_experts_per_tok"],
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
            "initial_context_length": 4096, "hidden_act": "silu", "attention_dropout": 0.0, "use_cache": True,
            "router_aux_loss_coef": 0.9, "output_router_logits": False, "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}}
    return cfg



def tensor_sizes(variant: str, layers: int) -> tuple[int, int]:
    """(bf16 elements, u8 elements) of the checkpoint `write` makes: what its disk use and parameter count follow."""
    cfg = real_config(variant, layers)
    h, inter, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    per_layer_bf16 = (2 * h + h * q + h + cfg["num_attention_heads"] + e * h + e + e * 2 * inter + e * h
                      + (q + 2 * kv) * (h + 1))
    per_layer_u8 = e * 2 * inter * (h // 32) * 17 + e * h * (inter // 32) * 17  # 16 block bytes + 1 scale per 32
    ends = 2 * cfg["vocab_size"] * h + h  # embeddings, lm_head, the final norm
    return ends + layers * per_layer_bf16, layers * per_layer_u8


def checkpoint_bytes(variant: str, layers: int) -> int:
    """The disk the checkpoint's weights take (about 1.75 GB a layer and 2.3 GB of embeddings at 120b's size)."""
    bf16, u8 = tensor_sizes(variant, layers)
    return 2 * bf16 + u8

def _mxfp4(gen: torch.Generator, experts: int, out: int, inp: int, std: float) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = torch.randint(0, 256, (experts, out, inp // 32, 16), generator=gen, dtype=torch.uint8)
    exp = round(torch.log2(torch.tensor(std)).item() - E2M1_RMS_LOG2)
    scales = torch.randint(exp - 1, exp + 2, (experts, out, inp // 32), generator=gen, dtype=torch.int16) + 127
    return blocks, scales.to(torch.uint8)


def part_names(layers: int) -> list[str]:
    """The checkpoint's shards in order: the embeddings, one per layer, the final norm with lm_head."""
    return ["embed", *(f"layer{i}" for i in range(layers)), "head"]


def part_tensors(cfg: dict, part: str, seed: int) -> dict[str, torch.Tensor]:
    """One shard's tensors, drawn from a generator of its own (the seed and the part's name): a part is the same
    whatever the layer count and whichever process draws it, so the parts are drawn in parallel and layer i of the
    8-layer checkpoint is layer i of the 24-layer one."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + sum(ord(c) << (8 * n) for n, c in enumerate(part)))
    h, inter, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    q, kv, vocab = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"], \
        cfg["vocab_size"]

    def normal(*shape: int, std: float, mean: float = 0.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * std + mean).to(torch.bfloat16)

    if part == "embed":
        return {"model.embed_tokens.weight": normal(vocab, h, std=1.0)}
    if part == "head":
        return {"model.norm.weight": normal(h, std=0.1, mean=1.0), "lm_head.weight": normal(vocab, h, std=3.0 / h**0.5)}
    p = f"model.layers.{int(part.removeprefix('layer'))}."
    t = {p + "input_layernorm.weight": normal(h, std=0.1, mean=1.0),
         p + "post_attention_layernorm.weight": normal(h, std=0.1, mean=1.0),
         p + "self_attn.o_proj.weight": normal(h, q, std=1.0 / q**0.5),
         p + "self_attn.o_proj.bias": normal(h, std=0.1),
         p + "self_attn.sinks": normal(cfg["num_attention_heads"], std=1.0),
         p + "mlp.router.weight": normal(e, h, std=2.0 / h**0.5), p + "mlp.router.bias": normal(e, std=0.5),
         p + "mlp.experts.gate_up_proj_bias": normal(e, 2 * inter, std=0.5),
         p + "mlp.experts.down_proj_bias": normal(e, h, std=0.1)}
    for name, dim in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        t[p + f"self_attn.{name}.weight"] = normal(dim, h, std=1.5 / h**0.5)
        t[p + f"self_attn.{name}.bias"] = normal(dim, std=0.3)
    for stem, (out, inp, std) in {"gate_up_proj": (2 * inter, h, 4.0 / h**0.5),
                                  "down_proj": (h, inter, 0.5 / inter**0.5)}.items():
        blocks, scales = _mxfp4(gen, e, out, inp, std)
        t[p + f"mlp.experts.{stem}_blocks"], t[p + f"mlp.experts.{stem}_scales"] = blocks, scales
    return t


def _write_part(cfg: dict, part: str, seed: int, path: Path) -> list[str]:
    """Draw one part and write it as its shard; its tensor names (the index's entries)."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)  # one part per process: the processes are the parallelism
    tensors = part_tensors(cfg, part, seed)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
    return list(tensors)


def _workers(parts: int) -> int:
    """Processes drawing parts at once: one per core, as many as memory holds (a part takes up to about 4 GB while
    it is drawn: the 201088 x 2880 embeddings in float32 beside their bf16 copy)."""
    from conformance.reference.gpt_oss import host_memory_available

    return max(1, min(os.cpu_count() or 1, parts, host_memory_available() // (4 * 2**30)))


def write(out_dir: Path, layers: int = 2, variant: str = "gpt-oss-120b", seed: int = 120,
          tokenizer_files: bool = True) -> Path:
    """The checkpoint in out_dir. `tokenizer_files=False`: weights and config alone, which serve the fp64
    reference's own tools (`python -m conformance.reference.device`) on a node without the o200k vocabulary, and
    no run (a run's model needs its tokenizer)."""
    # before gigabytes of weights: a node without the vocab is told at once
    tokenizer = _tokenizer_dir() if tokenizer_files else None
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = real_config(variant, layers)
    parts = part_names(layers)
    files = {part: f"model-{n:05d}-of-{len(parts):05d}.safetensors" for n, part in enumerate(parts)}
    # spawned, not forked: a forked torch with its thread pools started may hang in the child
    with ProcessPoolExecutor(_workers(len(parts)), mp_context=multiprocessing.get_context("spawn")) as pool:
        names = {part: pool.submit(_write_part, cfg, part, seed, out_dir / files[part]) for part in parts}
        index = {name: files[part] for part, done in names.items() for name in done.result()}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [200002, 199999, 200012],
                                                                "pad_token_id": 199999}))
    if tokenizer is None:
        return out_dir
    from conformance.checkpoints.tokenizer import hf_build

    for name in hf_build.TOKENIZER_FILES:  # beside the weights, as the published checkpoint ships them
        shutil.copyfile(tokenizer / name, out_dir / name)
    return out_dir


def _tokenizer_dir() -> Path:
    """The o200k_harmony HF tokenizer files the checkpoint carries (so the tokenizer checks and the run minimum judge
    a real-dim run too). Raises VocabUnavailable, with one sentence, where no o200k vocabulary can be had."""
    from conformance.checkpoints.tokenizer import hf_build, vocab

    return hf_build.hf_tokenizer_dir(vocab.ensure_o200k())


def sizes(variant: str, layer_counts: list[int]) -> dict:
    """What `nox -s bench --realdim` plans with (conformance/tooling/bench_realdim.py, which imports nothing of the
    suite): each layer count's disk use, and where the suite's cache keeps such checkpoints by default."""
    from conformance.datafiles import cache_root

    return {"bytes": {str(n): checkpoint_bytes(variant, n) for n in layer_counts},
            "root": str(cache_root() / "realdim")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path, nargs="?")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--variant", default="gpt-oss-120b", choices=["gpt-oss-120b", "gpt-oss-20b"])
    ap.add_argument("--seed", type=int, default=120)
    ap.add_argument("--sizes", metavar="L1,L2,...", help="write nothing: print as JSON the disk each of these layer "
                                                         "counts takes and the cache's place for such checkpoints")
    ap.add_argument("--weights-only", action="store_true",
                    help="write no tokenizer files (no o200k vocabulary needed): such a checkpoint serves "
                         "`python -m conformance.reference.device` (the fp64 reference on a GPU, against the CPU), "
                         "not a run")
    args = ap.parse_args(argv)
    if args.sizes:
        print(json.dumps(sizes(args.variant, [int(n) for n in args.sizes.split(",")])))
    elif args.out_dir is None:
        ap.error("the checkpoint's directory is required (or --sizes)")
    else:
        from conformance.checkpoints.tokenizer.vocab import VocabUnavailable

        try:
            print(write(args.out_dir, args.layers, args.variant, args.seed, not args.weights_only))
        except VocabUnavailable as exc:
            ap.exit(2, f"{ap.prog}: nothing written to {args.out_dir}: {exc}\n")


if __name__ == "__main__":
    main()
