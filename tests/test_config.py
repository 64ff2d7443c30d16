"""kvbench.config: the lab's defaults, validation naming expected and actual, presets as data."""

import dataclasses

import pytest
import torch

from kvbench.config import PRESETS, DecoderConfig, PlainConfig, RopeScaling, preset_config
from kvbench.kinds import parameter_count


def test_defaults_are_the_source_documents_lab():
    config = DecoderConfig()
    assert (config.width, config.heads, config.head_dim, config.layers) == (32, 4, 8, 1)
    assert config.kv_heads == 4  # None means one KV head per query head
    assert config.dtype == torch.float32
    assert config.max_length >= 128
    assert DecoderConfig(kv_heads=None) == config


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DecoderConfig().width = 64


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"width": 30}, r"heads must divide width: width 30 is not divisible by 4 heads"),
        ({"kv_heads": 3}, r"kv_heads must divide heads: 4 heads are not divisible by 3 kv_heads"),
        ({"layers": 0}, r"layers must be a positive integer, got 0"),
        ({"vocab_size": -5}, r"vocab_size must be a positive integer, got -5"),
        ({"max_length": 1.5}, r"max_length must be a positive integer, got 1.5"),
        ({"dtype": "int8"}, r"dtype must be one of .*got 'int8'"),
    ],
)
def test_invalid_config_names_expected_and_actual(fields, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig(**fields)


def test_config_dict_round_trip():
    config = DecoderConfig(width=64, heads=8, kv_heads=2, layers=2, dtype=torch.bfloat16)
    fields = config.to_dict()
    assert fields["dtype"] == "bfloat16" and fields["kv_heads"] == 2
    assert DecoderConfig.from_dict(fields) == config
    with pytest.raises(ValueError, match=r"unknown DecoderConfig fields \['colour'\]"):
        DecoderConfig.from_dict({**fields, "colour": 1})


def test_presets():
    assert set(PRESETS) >= {"seed", "medium"}
    assert preset_config("seed") == DecoderConfig()
    medium = preset_config("medium")
    assert (medium.width, medium.heads, medium.layers, medium.max_length) == (256, 8, 4, 4096)
    assert preset_config("medium", kv_heads=2).kv_heads == 2
    with pytest.raises(ValueError, match=r"preset must be one of \['gemma-2-2b', .*'medium', .*'seed'\], got 'huge'"):
        preset_config("huge")


def test_config_is_still_importable_from_the_model_module():
    from kvbench import model

    assert model.DecoderConfig is DecoderConfig and model.PRESETS is PRESETS


# --- model families: architecture as data ------------------------------------------

# What each published preset must be, from its model's config.json: (layers, width, heads, kv_heads, head_dim,
# intermediate_size, vocab_size, max_position_embeddings, rope_theta, window, pattern, tied, q/k/v bias) and the
# parameter count its model card publishes (Gemma-2-2B's less the two norms per layer kvbench leaves out).
PUBLISHED = {
    "llama-3.2-1b": ((16, 2048, 32, 8, 64, 8192, 128256, 131072, 500000.0, None, None, True, False), 1_235_814_400),
    "llama-3.1-8b": ((32, 4096, 32, 8, 128, 14336, 128256, 131072, 500000.0, None, None, False, False), 8_030_261_248),
    "qwen2.5-0.5b": ((24, 896, 14, 2, 64, 4864, 151936, 32768, 1000000.0, None, None, True, True), 494_032_768),
    "qwen2.5-7b": ((28, 3584, 28, 4, 128, 18944, 152064, 131072, 1000000.0, None, None, False, True), 7_615_616_512),
    "mistral-7b": ((32, 4096, 32, 8, 128, 14336, 32000, 32768, 10000.0, 4096, None, False, False), 7_241_732_096),
    "gemma-2-2b": ((26, 2304, 8, 4, 256, 9216, 256000, 8192, 10000.0, 4096, "alternating", True, False),
                   2_614_341_888 - 26 * 2 * 2304),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_presets_have_the_published_shapes_and_parameter_counts(name):
    config = PlainConfig.from_preset(name)
    shapes, parameters = PUBLISHED[name]
    assert config.family == "llama"
    assert (config.layers, config.width, config.heads, config.kv_heads, config.head_dim, config.intermediate_size,
            config.vocab_size, config.max_length, config.rope_theta, config.window, config.window_pattern,
            config.tie_embeddings, config.qkv_bias) == shapes
    assert parameter_count(config) == parameters


def test_every_preset_name_is_one_a_record_accepts():
    from kvbench.config import PRESET_NAME
    from kvbench.record.schema import RECORD_SCHEMA

    assert all(PRESET_NAME.fullmatch(name) for name in PRESETS)
    assert RECORD_SCHEMA["properties"]["run"]["properties"]["preset"]["pattern"] == f"^{PRESET_NAME.pattern}$"


def test_llama_3_presets_scale_their_rotary_frequencies():
    assert PlainConfig.from_preset("llama-3.1-8b").rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    assert PlainConfig.from_preset("llama-3.2-1b").rope_scaling.factor == 32.0
    assert PlainConfig.from_preset("qwen2.5-7b").rope_scaling is None


def test_the_seed_lab_is_still_the_gpt2_family_and_gains_only_its_own_values():
    config = DecoderConfig()
    assert config.family == "gpt2" and config.head_dim == 8 and config.intermediate_size == 128
    assert config.qkv_bias is True and config.tie_embeddings is False and config.rope_theta is None
    assert config.layer_windows == (None,)


def test_an_old_records_config_reads_as_the_gpt2_family():
    old = {"vocab_size": 128, "width": 32, "heads": 4, "kv_heads": 4, "layers": 1, "max_length": 2048, "mlp_ratio": 4,
           "dtype": "float32", "window": None}
    assert PlainConfig.from_dict(old) == PlainConfig()
    assert PlainConfig.from_dict(PlainConfig.from_preset("gemma-tiny").to_dict()) == PlainConfig.from_preset("gemma-tiny")


def test_a_records_config_edited_to_another_width_derives_its_head_width_again():
    edited = PlainConfig.from_dict({**PlainConfig().to_dict(), "width": 64})
    assert (edited.head_dim, edited.intermediate_size) == (16, 256)
    gemma, llama = PlainConfig.from_preset("gemma-tiny").to_dict(), PlainConfig.from_preset("llama-tiny").to_dict()
    assert gemma["head_dim"] == 16 and llama["intermediate_size"] == 192  # not the derived values: kept
    assert llama["head_dim"] is None and gemma["intermediate_size"] is None  # 64 / 4 and 4 x 72: derived


def test_head_dim_need_not_be_width_over_heads():
    config = DecoderConfig(family="llama", width=72, heads=4, head_dim=16)
    assert config.head_dim == 16 and config.heads * config.head_dim != config.width


@pytest.mark.parametrize("fields, windows", [
    ({"window": 4, "layers": 3}, (4, 4, 4)),
    ({"window": 4, "layers": 3, "window_pattern": "all"}, (4, 4, 4)),
    ({"window": 4, "layers": 5, "window_pattern": "alternating"}, (4, None, 4, None, 4)),
    ({"layers": 2}, (None, None)),
])
def test_each_layer_has_its_window(fields, windows):
    assert DecoderConfig(family="llama", **fields).layer_windows == windows


@pytest.mark.parametrize("fields, message", [
    ({"family": "t5"}, r"family must be one of \['gpt2', 'llama'\], got 't5'"),
    ({"window_pattern": "alternating"}, r"window_pattern 'alternating' needs a sliding window: expected window=W, got window=None"),
    ({"window": 8, "window_pattern": "every-third"}, r"window_pattern must be one of \['all', 'alternating'\]"),
    ({"rope_theta": 10000.0}, r"rope_theta belongs to the llama family.*expected rope_theta=None for family 'gpt2'"),
    ({"tie_embeddings": True}, r"tie_embeddings belongs to the llama family"),
    ({"qkv_bias": False}, r"the gpt2 family has a bias on every projection: expected qkv_bias=True or None, got False"),
    ({"head_dim": 16}, r"the gpt2 family's head width is width / heads: expected head_dim=None or 8, got 16"),
    ({"heads": 5, "head_dim": 8}, r"heads must divide width: width 32 is not divisible by 5 heads"),
    ({"family": "llama", "heads": 4, "kv_heads": 3}, r"kv_heads must divide heads"),
    ({"family": "llama", "width": 30}, r"heads must divide width: width 30 is not divisible by 4 heads"),
    ({"family": "llama", "head_dim": 7}, r"expected an even head_dim, got 7"),
    ({"family": "llama", "rope_theta": -1.0}, r"rope_theta must be a positive finite number, got -1.0"),
    ({"family": "llama", "norm_eps": 0}, r"norm_eps must be a positive finite number, got 0"),
    ({"family": "llama", "rope_scaling": {"factor": 8.0}}, r"rope_scaling must be None or have exactly the fields"),
    ({"family": "llama", "rope_scaling": {"factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                                          "original_max_length": 8192}}, r"low_freq_factor < high_freq_factor"),
])
def test_a_field_that_contradicts_the_family_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        PlainConfig(**fields)
