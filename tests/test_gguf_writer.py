"""kvbench.models.gguf_writer: a model written as GGUF reads back through llama.cpp's own reader with the shapes,
metadata and numbers llama.cpp expects; the q/k permutation and the rotary factors are checked against what
they stand for (llama.cpp's adjacent-pair rotation, kvbench's scaled frequencies), not against themselves."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from kvbench.config import DecoderConfig, preset_config
from kvbench.model import build_model, llama3_frequencies
from kvbench.models.gguf_writer import gguf_tensors, permute, rope_factors, vocabulary, write_gguf

gguf = pytest.importorskip("gguf")

TINY = {"family": "llama", "vocab_size": 300, "width": 32, "heads": 4, "kv_heads": 2, "layers": 2,
        "intermediate_size": 48, "max_length": 128, "norm_eps": 1e-5, "rope_theta": 10000.0}
SCALED = {**TINY, "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0, "original_max_length": 64}}


def read(path: Path):
    reader = gguf.GGUFReader(path)
    fields = {name: reader.fields[name].contents() for name in reader.fields}
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    return fields, tensors


def torch_shape(tensor) -> tuple[int, ...]:
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def test_round_trip_through_gguf_reader(tmp_path):
    model = build_model(DecoderConfig.from_dict(SCALED), seed=3)
    fields, tensors = read(write_gguf(model, tmp_path / "tiny.gguf", name="tiny"))
    assert fields["general.architecture"] == "llama" and fields["general.name"] == "tiny"
    assert fields["general.file_type"] == 0  # ALL_F32
    expected = {"llama.block_count": 2, "llama.embedding_length": 32, "llama.feed_forward_length": 48,
                "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2, "llama.context_length": 128,
                "llama.rope.dimension_count": 8, "llama.attention.key_length": 8, "llama.vocab_size": 300,
                "tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    assert {name: fields[name] for name in expected} == expected
    assert fields["llama.rope.freq_base"] == pytest.approx(500000.0)
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert len(fields["tokenizer.ggml.tokens"]) == 300 and len(set(fields["tokenizer.ggml.tokens"])) == 300
    assert fields["tokenizer.ggml.tokens"][3] == "<0x00>"
    shapes = {"token_embd.weight": (300, 32), "output.weight": (300, 32), "output_norm.weight": (32,),
              "rope_freqs.weight": (4,), "blk.1.attn_q.weight": (32, 32), "blk.1.attn_k.weight": (16, 32),
              "blk.1.attn_v.weight": (16, 32), "blk.1.attn_output.weight": (32, 32), "blk.1.ffn_gate.weight": (48, 32),
              "blk.1.ffn_up.weight": (48, 32), "blk.1.ffn_down.weight": (32, 48), "blk.1.attn_norm.weight": (32,)}
    assert {name: torch_shape(tensors[name]) for name in shapes} == shapes
    assert len(tensors) == 4 + 9 * 2
    assert {tensor.tensor_type.name for tensor in tensors.values()} == {"F32"}
    down = np.asarray(tensors["blk.1.ffn_down.weight"].data).reshape(32, 48)
    np.testing.assert_array_equal(down, model.blocks[1].down.weight.numpy())
    gate = np.asarray(tensors["blk.0.ffn_gate.weight"].data).reshape(48, 32)
    np.testing.assert_array_equal(gate, model.blocks[0].gate_up.weight[:48].numpy())


def test_a_bfloat16_model_is_written_with_bf16_matrices_of_the_same_numbers(tmp_path):
    """As llama.cpp's converter writes --outtype bf16: matrices BF16, vectors (norms, biases, rope factors) F32;
    every value the bfloat16 model holds, bit for bit."""
    model = build_model(DecoderConfig.from_dict({**SCALED, "qkv_bias": True, "dtype": "bfloat16"}), seed=3)
    fields, tensors = read(write_gguf(model, tmp_path / "tiny-bf16.gguf"))
    assert fields["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16
    types = {name: tensor.tensor_type.name for name, tensor in tensors.items()}
    assert {types[name] for name in ("token_embd.weight", "output.weight", "blk.1.ffn_down.weight")} == {"BF16"}
    assert {types[name] for name in ("blk.1.attn_norm.weight", "blk.0.attn_q.bias", "rope_freqs.weight")} == {"F32"}
    down = tensors["blk.1.ffn_down.weight"]
    np.testing.assert_array_equal(gguf.quants.dequantize(down.data, down.tensor_type).reshape(32, 48),
                                  model.blocks[1].down.weight.float().numpy())
    norm = np.asarray(tensors["blk.1.attn_norm.weight"].data)
    np.testing.assert_array_equal(norm, model.blocks[1].norm1.weight.float().numpy())
    with pytest.raises(ValueError, match="float32 or bfloat16 model, got dtype torch.float16"):
        write_gguf(build_model(DecoderConfig.from_dict({**TINY, "dtype": "float16"}), seed=0), tmp_path / "refused.gguf")


def test_permuted_rows_are_the_pairs_llama_cpp_turns():
    """llama.cpp's rotary kernel (LLAMA_ROPE_TYPE_NORM) turns channels (2i, 2i + 1) of each head by frequency i;
    kvbench turns (i, i + D/2). After the permutation the projected vector's adjacent pairs are kvbench's halves."""
    model = build_model(DecoderConfig.from_dict(TINY), seed=1)
    H, KVH, D = 4, 2, 8
    tensors = gguf_tensors(model)
    hidden = torch.randn(32, generator=torch.Generator().manual_seed(0)).numpy()
    for name, heads, rows in (("attn_q", H, slice(0, H * D)), ("attn_k", KVH, slice(H * D, (H + KVH) * D))):
        kvbench = (model.blocks[0].qkv.weight[rows].numpy() @ hidden).reshape(heads, 2, D // 2)
        llama = (tensors[f"blk.0.{name}.weight"] @ hidden).reshape(heads, D // 2, 2)
        np.testing.assert_allclose(llama[..., 0], kvbench[:, 0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(llama[..., 1], kvbench[:, 1], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(tensors["blk.0.attn_v.weight"], model.blocks[0].qkv.weight[(H + KVH) * D:].numpy())
    assert permute(np.arange(8.0), 1).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_rope_factors_divide_to_kvbench_frequencies():
    """llama.cpp divides each base frequency by rope_freqs; kvbench scales them in llama3_frequencies."""
    for config in (DecoderConfig.from_dict(SCALED), preset_config("llama-mini")):
        D = config.head_dim
        inverse = 1.0 / (config.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float) / D))
        expected = llama3_frequencies(inverse, config.rope_scaling)
        factors = rope_factors(config)
        assert factors.min() == 1.0 and factors.max() == config.rope_scaling.factor  # both ends of the band present
        np.testing.assert_allclose(inverse.numpy() / factors, expected.numpy(), rtol=1e-6)


def test_unscaled_config_has_no_rope_freqs_and_tied_head_no_output():
    model = build_model(DecoderConfig.from_dict({**TINY, "tie_embeddings": True}), seed=0)
    assert {"rope_freqs.weight", "output.weight"}.isdisjoint(gguf_tensors(model))


@pytest.mark.parametrize("config, message", [(DecoderConfig(), "llama family, got family 'gpt2'"),
                                             (DecoderConfig.from_dict({**TINY, "window": 16}), "sliding window")])
def test_refuses_what_the_llama_architecture_cannot_hold(config, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        write_gguf(build_model(config, seed=0), tmp_path / "refused.gguf")
    assert not (tmp_path / "refused.gguf").exists()


def test_vocabulary_fits_small_and_large_sizes():
    tokens, types = vocabulary(8)
    assert tokens == ["<unk>", "<s>", "</s>", "t0", "t1", "t2", "t3", "t4"] and types[:3] == [2, 3, 3]
    tokens, types = vocabulary(1024)
    assert tokens[3 + 0x0A] == "<0x0A>" and types.count(6) == 256 and len(set(tokens)) == 1024
    with pytest.raises(ValueError, match="at least 3 tokens"):
        vocabulary(2)


def test_kvbench_gguf_reads_the_written_file_to_equal_logits(tmp_path, monkeypatch):
    """The strongest check, when kvbench's GGUF reader is present: reading the file back (undoing the
    permutation) gives the original model's logits."""
    reader = pytest.importorskip("kvbench.models.gguf")
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    model = build_model(DecoderConfig.from_dict({**TINY, "qkv_bias": True}), seed=2)
    path = write_gguf(model, tmp_path / "tiny.gguf")
    loaded, _ = reader.build_gguf_model(reader.read_gguf(path))
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids)[0], model(ids)[0], rtol=0, atol=1e-6)


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "llamacpp.py"
EVAL_CALLBACK = """\
number of input tokens = 2
  1
  75
common_debug_cb_eval:            result_output = (f32)    MUL_MAT(output.weight{4, 9, 1, 1}, result_norm{4, 1, 1, 1}}) = {9, 1, 1, 1}
    [
        [
            [      0.1000,      -0.2000,       0.3000,    ...,       0.7000,       0.8000,       0.9000  ],
        ],
    ]
    sum = 2.600000
"""


def test_eval_callback_printout_is_compared_where_it_printed():
    spec = importlib.util.spec_from_file_location("llamacpp", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    printed = script.printed_tensors(EVAL_CALLBACK)
    assert script.printed_token_ids(EVAL_CALLBACK) == [1, 75]
    assert printed["result_output"]["shape"] == [9, 1, 1, 1] and printed["result_output"]["sum"] == 2.6
    logits = np.array([[9.0] * 9, [0.1, -0.2, 0.3, 5.0, 5.0, 5.0, 0.7, 0.8, 0.9]])  # the last row is the output
    assert script.compare_rows(printed["result_output"], logits) == pytest.approx(0.0, abs=1e-12)
    logits[1, 7] = 0.85
    assert script.compare_rows(printed["result_output"], logits) == pytest.approx(0.05)
