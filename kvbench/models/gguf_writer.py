"""kvbench's llama-family model as a GGUF file that llama.cpp runs: the same numbers in llama.cpp's layout.

The file is what llama.cpp's converter (convert_hf_to_gguf.py) would write from the same weights in
transformers' layout: architecture llama, every tensor F32 (a bfloat16 model's matrices BF16, its vectors F32,
as the converter's --outtype bf16 writes them), q and k rows permuted (its LlamaModel.permute:
llama.cpp's rotary kernel turns adjacent channel pairs, kvbench's and transformers' turn channel i with
i + D/2), llama 3's rotary scaling as the converter's rope_freqs tensor (each frequency's divisor). The
vocabulary is minimal but valid for llama.cpp: SentencePiece-style (<unk>, <s>, </s>, the 256 byte tokens
where they fit, then distinct fillers), so llama-bench can draw token ids and llama.cpp's tools can
tokenize text (bytes fall back to byte tokens). Written with llama.cpp's own `gguf` package, pinned in
pyproject's `gguf` extra. The family's sliding window and gpt2's block have no llama-architecture
equivalent and are refused.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kvbench.models.gguf import require_gguf

TOKEN_TYPES = {"normal": 1, "unknown": 2, "control": 3, "byte": 6}  # gguf.TokenType's values
BOS, EOS, UNK = 1, 2, 0


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's permutation of q or k rows (LlamaModel.permute): per head, the rows (2, D/2)
    become (D/2, 2), so the pairs llama.cpp's rotary kernel turns are the halves kvbench's turns."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def rope_factors(config) -> np.ndarray:
    """The converter's rope_freqs tensor for llama 3's scaling: each frequency's divisor (1 for short waves,
    `factor` for long ones, interpolated between)."""
    scaling, D = config.rope_scaling, config.head_dim
    inverse = 1.0 / (config.rope_theta ** (np.arange(0, D, 2, dtype=np.float32) / D))
    low, high = scaling.original_max_length / scaling.low_freq_factor, scaling.original_max_length / scaling.high_freq_factor
    factors = []
    for frequency in inverse:
        wavelength = 2 * math.pi / frequency
        smooth = (scaling.original_max_length / wavelength - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor)
        factors.append(1.0 if wavelength < high else scaling.factor if wavelength > low
                       else 1 / ((1 - smooth) / scaling.factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def check_writable(config) -> None:
    if config.family != "llama":
        raise ValueError(f"a GGUF of architecture llama needs the llama family, got family {config.family!r}")
    if config.window is not None:
        raise ValueError(f"llama.cpp's llama architecture has no sliding window: expected window None, got {config.window}")


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """Every tensor by its GGUF name, float32, in torch's (rows, columns) order (the writer reverses it)."""
    config = model.config
    check_writable(config)
    H, KVH, D = config.heads, config.kv_heads, config.head_dim
    array = lambda tensor: tensor.detach().float().contiguous().numpy().copy()  # noqa: E731
    tensors = {"token_embd.weight": array(model.token.weight), "output_norm.weight": array(model.final.weight)}
    if model.head is not None:
        tensors["output.weight"] = array(model.head.weight)
    if config.rope_scaling is not None:
        tensors["rope_freqs.weight"] = rope_factors(config)
    for layer, block in enumerate(model.blocks):
        q, k, v = np.split(array(block.qkv.weight), [H * D, H * D + KVH * D])
        gate, up = np.split(array(block.gate_up.weight), 2)
        named = {"attn_norm.weight": array(block.norm1.weight), "attn_q.weight": permute(q, H),
                 "attn_k.weight": permute(k, KVH), "attn_v.weight": v, "attn_output.weight": array(block.out.weight),
                 "ffn_norm.weight": array(block.norm2.weight), "ffn_gate.weight": gate, "ffn_up.weight": up,
                 "ffn_down.weight": array(block.down.weight)}
        if config.qkv_bias:
            qb, kb, vb = np.split(array(block.qkv.bias), [H * D, H * D + KVH * D])
            named.update({"attn_q.bias": permute(qb, H), "attn_k.bias": permute(kb, KVH), "attn_v.bias": vb})
        tensors.update({f"blk.{layer}.{name}": np.ascontiguousarray(value) for name, value in named.items()})
    return tensors


def vocabulary(size: int) -> tuple[list[str], list[int]]:
    """Tokens and their types: <unk>, <s>, </s>, the 256 byte tokens where they fit, then distinct fillers."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOKEN_TYPES["unknown"], TOKEN_TYPES["control"], TOKEN_TYPES["control"]]
    if size >= len(tokens) + 256:
        tokens += [f"<0x{byte:02X}>" for byte in range(256)]
        types += [TOKEN_TYPES["byte"]] * 256
    fillers = size - len(tokens)
    if fillers < 0:
        raise ValueError(f"a vocabulary needs at least 3 tokens (<unk>, <s>, </s>), got vocab_size {size}")
    return tokens + [f"t{index}" for index in range(fillers)], types + [TOKEN_TYPES["normal"]] * fillers


# GGUF's llama shape keys (the writer's add_<key> methods) and the config field each is read from.
SHAPE_FIELDS = (("context_length", "max_length"), ("embedding_length", "width"), ("block_count", "layers"),
                ("feed_forward_length", "intermediate_size"), ("head_count", "heads"), ("head_count_kv", "kv_heads"),
                ("key_length", "head_dim"), ("value_length", "head_dim"), ("rope_dimension_count", "head_dim"),
                ("rope_freq_base", "rope_theta"), ("layer_norm_rms_eps", "norm_eps"), ("vocab_size", "vocab_size"))


def add_shapes(writer, config) -> None:
    """The llama family's shape metadata of `config`, which a GGUF reader builds the model from."""
    for key, field in SHAPE_FIELDS:
        getattr(writer, f"add_{key}")(getattr(config, field))


def write_gguf(model, path: Path | str, name: str = "kvbench") -> Path:
    """kvbench's model as a GGUF of architecture llama that llama.cpp loads and runs: F32, or for a bfloat16
    model its matrices in BF16 (the same numbers: a bfloat16 value is exact in float32 and back)."""
    gguf = require_gguf()
    config, path = model.config, Path(path)
    tensors = gguf_tensors(model)
    bf16 = str(config.dtype).removeprefix("torch.") == "bfloat16"
    if not bf16 and str(config.dtype).removeprefix("torch.") != "float32":
        raise ValueError(f"a GGUF is written from a float32 or bfloat16 model, got dtype {config.dtype}")
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    add_shapes(writer, config)
    tokens, types = vocabulary(config.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    for tensor_name, values in tensors.items():
        if bf16 and values.ndim == 2:
            writer.add_tensor(tensor_name, gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(tensor_name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
