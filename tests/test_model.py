"""kvbench.model: seeded random weights, the forward pass and its shapes."""


import pytest
import torch

from kvbench.model import DecoderConfig, build_model


def test_same_seed_same_weights_and_other_seed_differs():
    config = DecoderConfig(layers=2, kv_heads=2)
    a, b, c = build_model(config, seed=0), build_model(config, seed=0), build_model(config, seed=1)
    for (name, x), (_, y), (_, z) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(x, y), name
    assert any(not torch.equal(x, z) for x, z in zip(a.state_dict().values(), c.state_dict().values()))


def test_build_model_does_not_disturb_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(DecoderConfig(), seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_model_state():
    model = build_model(DecoderConfig(layers=3), seed=0)
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert model.config.layers == len(model.blocks) == 3
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.float64 for p in build_model(DecoderConfig(dtype=torch.float64)).parameters())


def test_gqa_projection_shrinks_with_kv_heads():
    mha = build_model(DecoderConfig(heads=4), seed=0)
    mqa = build_model(DecoderConfig(heads=4, kv_heads=1), seed=0)
    assert mha.blocks[0].qkv.out_features == 3 * 32
    assert mqa.blocks[0].qkv.out_features == 32 + 2 * 8


def test_forward_shapes_and_fresh_cache():
    config = DecoderConfig()
    model = build_model(config, seed=0)
    ids = torch.randint(0, config.vocab_size, (3, 5))
    with torch.inference_mode():
        logits, cache = model(ids)
    assert logits.shape == (3, 5, config.vocab_size)
    assert logits.dtype == torch.float32
    assert cache.length == 5 and cache.kind == "concat"
    assert torch.isfinite(logits).all()
    assert not hasattr(model, "cache")  # no per-request state on the model


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_run_and_match_cached(dtype):
    from kvbench.workloads.decode import check_equivalence, token_ids

    model = build_model(DecoderConfig(dtype=dtype), seed=0)
    ids = token_ids(model.config, 1, 12)
    results = check_equivalence(model, ids, ["concat", "static"])
    assert all(r.passed for r in results.values()), results


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, 1.5, True, "0"])
def test_a_seed_torch_cannot_take_is_refused_by_name(seed):
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*63\), got"):
        build_model(DecoderConfig(), seed=seed)


# --- the llama family -------------------------------------------------------------------

from kvbench.model import apply_rotary, preset_config, rotary_tables  # noqa: E402


def test_rotation_is_by_absolute_position_and_attention_sees_only_the_distance():
    config = preset_config("llama-tiny")
    cos, sin = rotary_tables(config)
    assert cos.shape == sin.shape == (config.max_length, 1, config.head_dim)
    assert torch.equal(cos[0], torch.ones_like(cos[0])) and torch.equal(sin[0], torch.zeros_like(sin[0]))
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, config.head_dim, generator=generator), torch.randn(1, 1, 1, config.head_dim, generator=generator)

    def score(p: int, r: int) -> float:
        return float((apply_rotary(q, cos[p : p + 1], sin[p : p + 1]) * apply_rotary(k, cos[r : r + 1], sin[r : r + 1])).sum())

    assert score(9, 4) == pytest.approx(score(105, 100), rel=1e-4) and score(9, 4) != pytest.approx(score(9, 5), rel=1e-3)
    rotated = apply_rotary(q, cos[7:8], sin[7:8])
    assert torch.linalg.vector_norm(rotated) == pytest.approx(float(torch.linalg.vector_norm(q)), rel=1e-6)


def test_llama3_scaling_slows_only_the_long_wavelengths():
    import dataclasses

    scaled = preset_config("llama-tiny")
    plain = dataclasses.replace(scaled, rope_scaling=None)
    (cos_s, _), (cos_p, _) = rotary_tables(scaled), rotary_tables(plain)
    D = scaled.head_dim
    assert torch.equal(cos_s[:, :, 0], cos_p[:, :, 0])  # the fastest frequency is kept
    assert not torch.allclose(cos_s[:, :, D // 2 - 1], cos_p[:, :, D // 2 - 1])  # the slowest is stretched


def test_a_tied_head_is_the_token_embedding_and_qwen2_biases_exist_only_when_asked():
    tied = build_model(preset_config("llama-tiny"), seed=0)
    assert tied.head is None and tied.blocks[0].qkv.bias is None
    qwen = build_model(preset_config("qwen-tiny"), seed=0)
    assert qwen.blocks[0].qkv.bias is not None and qwen.blocks[0].out.bias is None
    untied = build_model(preset_config("llama-mini"), seed=0)
    assert untied.head is not None and untied.head.bias is None
    ids = torch.randint(0, 256, (1, 5))
    with torch.inference_mode():
        logits, _ = tied(ids)
    assert logits.shape == (1, 5, 256) and torch.isfinite(logits).all()


def test_the_llama_family_is_seeded_and_its_blocks_carry_their_layers_window():
    config = preset_config("gemma-tiny")
    a, b = build_model(config, seed=0), build_model(config, seed=0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert [block.window for block in a.blocks] == [64, None, 64, None]
    assert "position.weight" not in a.state_dict() and "cos" not in a.state_dict()  # tables, not weights
