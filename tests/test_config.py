"""kvbench.config: the lab's defaults, validation naming expected and actual, presets as data."""

import dataclasses

import pytest
import torch

from kvbench.config import PRESETS, DecoderConfig, preset_config


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
    with pytest.raises(ValueError, match=r"preset must be one of \['medium', 'seed'\], got 'huge'"):
        preset_config("huge")


def test_config_is_still_importable_from_the_model_module():
    from kvbench import model

    assert model.DecoderConfig is DecoderConfig and model.PRESETS is PRESETS
