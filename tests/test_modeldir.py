"""`--model DIR` validation: damaged checkpoints get one sentence naming the problem."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from conformance.checkpoints.modeldir import ModelDirError, inspect_model_dir


@pytest.fixture
def model_copy(tiny, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(tiny.path, dst)
    return dst


def rewrite_header(path, change):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    change(header)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def one_sentence(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.endswith(".")
    return text


def test_good_checkpoint_is_accepted(model_copy, tiny):
    info = inspect_model_dir(model_copy)
    assert info.config["model_type"] == "gpt_oss" and info.dtypes == {"F32"}


def test_wrong_dtype_in_safetensors_header_is_refused(model_copy):
    def to_bf16(h):
        h["lm_head.weight"]["dtype"] = "BF16"

    rewrite_header(model_copy / "model.safetensors", to_bf16)
    with pytest.raises(ModelDirError) as exc:
        inspect_model_dir(model_copy)
    assert "lm_head.weight is declared BF16" in one_sentence(exc)


def test_truncated_shard_is_refused(model_copy):
    f = model_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(ModelDirError) as exc:
        inspect_model_dir(model_copy)
    assert "truncated" in one_sentence(exc)


def test_missing_config_and_wrong_model_type(model_copy):
    (model_copy / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelDirError, match="not 'gpt_oss'"):
        inspect_model_dir(model_copy)
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelDirError, match="no config.json"):
        inspect_model_dir(model_copy)


def test_not_a_directory(tmp_path):
    with pytest.raises(ModelDirError, match="not a directory"):
        inspect_model_dir(tmp_path / "nope")


def write_shard(path, tensors, metadata=None):
    """A safetensors file from {name: (dtype, shape, nbytes)}, zero-filled."""
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_newer_dtypes_are_read_not_called_damaged(model_copy):
    """MXFP4-era dtypes (the E8M0 scales, packed F4) that the old hand-written dtype table refused."""
    from conformance.checkpoints.modeldir import read_safetensors

    shard = model_copy / "extra.safetensors"
    write_shard(shard, {"s.scales": ("F8_E8M0", [2, 4], 8), "w.packed": ("F4", [2, 4], 4)}, {"format": "pt"})
    tensors, metadata = read_safetensors(shard)
    assert tensors == {"s.scales": {"dtype": "F8_E8M0", "shape": [2, 4]}, "w.packed": {"dtype": "F4", "shape": [2, 4]}}
    assert metadata == {"format": "pt"}
    assert {"F8_E8M0", "F4", "F32"} <= inspect_model_dir(model_copy).dtypes


def test_unknown_dtype_and_short_span_are_one_sentence_naming_the_tensor(model_copy):
    shard = model_copy / "extra.safetensors"
    write_shard(shard, {"x": ("F9_E9", [4], 4)})
    with pytest.raises(ModelDirError) as exc:
        inspect_model_dir(model_copy)
    assert "tensor x has dtype 'F9_E9', which safetensors" in one_sentence(exc)
    write_shard(shard, {"w.packed": ("F4", [2, 4], 3)})  # 8 four-bit values need 4 bytes
    with pytest.raises(ModelDirError) as exc:
        inspect_model_dir(model_copy)
    assert "tensor w.packed is declared F4 [2, 4] (4 bytes) but spans 3 bytes" in one_sentence(exc)


def test_shard_shorter_than_its_header_length_is_one_sentence(model_copy):
    (model_copy / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(ModelDirError) as exc:
        inspect_model_dir(model_copy)
    assert "larger than the file" in one_sentence(exc)


def test_an_mxfp4_checkpoint_counts_the_parameters_its_model_has(tiny, tmp_path, monkeypatch):
    """Two E2M1 values a block byte, scales no parameters: the tiny model written in MXFP4 has the tiny model's count,
    which is what a float32 copy of it holds (the exact verdict sizes its slice by it)."""
    from conformance.checkpoints import crafted
    from conformance.checkpoints.modeldir import inspect_model_dir

    monkeypatch.setenv("CONFORMANCE_CACHE", str(tmp_path))
    assert inspect_model_dir(crafted.mxfp4()).num_params == inspect_model_dir(tiny.path).num_params
