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
    from kvbench.decode import check_equivalence, token_ids

    model = build_model(DecoderConfig(dtype=dtype), seed=0)
    ids = token_ids(model.config, 1, 12)
    results = check_equivalence(model, ids, ["concat", "static"])
    assert all(r.passed for r in results.values()), results


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, 1.5, True, "0"])
def test_a_seed_torch_cannot_take_is_refused_by_name(seed):
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*63\), got"):
        build_model(DecoderConfig(), seed=seed)
