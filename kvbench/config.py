"""Model dimensions: the floor every other module builds on (model and cache both import it).

`DecoderConfig`'s defaults are the source document's lab; presets are data, a name and
the fields it overrides. A model family is data too: `family` names the block
(kvbench.model holds one per family) and the other fields say what the block is made of.
Derived values (head width, key/value heads, intermediate size, the window of each layer)
are filled in at construction or are properties, so a config is always complete and
checked, and a field that contradicts its family is refused. torch is imported only to
turn a dtype name into a torch.dtype: `PlainConfig` has the same fields and checks with
the dtype as a name, for everything that only reads numbers.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}
# gpt2: the source document's block (learned positions, LayerNorm, GELU MLP, biases everywhere, untied head).
# llama: rotary positions, RMSNorm, SwiGLU, no biases but Qwen2's on q/k/v, head width free, tied head or not.
FAMILIES = ("gpt2", "llama")
WINDOW_PATTERNS = ("all", "alternating")  # alternating: layers 0, 2, 4, ... slide (Gemma-2), the others see all
# A preset's name: a plain word that may carry a published version ("qwen2.5-0.5b"); nothing a terminal,
# markdown or HTML interprets.
PRESET_NAME = re.compile(r"[a-z][a-z0-9._-]{0,39}")
LLAMA_ONLY = {"rope_theta": None, "rope_scaling": None, "tie_embeddings": False}  # field -> its gpt2 value


def __getattr__(name: str):
    """DTYPES (name -> torch.dtype) is built on first use, so that importing the config costs no torch."""
    if name == "DTYPES":
        import torch

        return {dtype: getattr(torch, dtype) for dtype in DTYPE_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def dtype_name(dtype: object) -> str:
    """'float32' for torch.float32 or for 'float32'."""
    return str(dtype).removeprefix("torch.")


def check_dtype_name(value: object) -> str:
    """The name of a dtype kvbench offers, given as a name or a torch.dtype (told by its type's
    name, so that no torch is imported), or ValueError."""
    is_torch_dtype = type(value).__name__ == "dtype"
    if (isinstance(value, str) or is_torch_dtype) and dtype_name(value) in DTYPE_NAMES:
        return dtype_name(value)
    raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {dtype_name(value) if is_torch_dtype else repr(value)}")


def parse_dtype(value: object):
    """The torch.dtype of a name or a torch.dtype kvbench offers, or ValueError."""
    import torch

    return getattr(torch, check_dtype_name(value))


def positive_int(name: str, value: object, lowest: int | None = None, optional: bool = False) -> int | None:
    """`value` if it is an int (not a bool) of at least `lowest` (default 1), or None when `optional`; else
    ValueError naming what was expected and what came. Every count kvbench takes is checked here."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if lowest is None else lowest):
        expected = "a positive integer" if lowest is None else f"an integer >= {lowest}"
        raise ValueError(f"{name} must be {expected}{' or None' if optional else ''}, got {value!r}")
    return value


def positive_number(name: str, value: object) -> float:
    """`value` if it is a finite int or float above 0 (not a bool); else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's frequency scaling of RoPE (rope_type "llama3" in its config): wavelengths longer than
    original_max_length / low_freq_factor are stretched by `factor`, shorter than original_max_length /
    high_freq_factor are kept, the ones between are interpolated smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_length: int

    def __post_init__(self) -> None:
        for name in ("factor", "low_freq_factor", "high_freq_factor", "original_max_length"):
            positive_number(f"rope_scaling.{name}", getattr(self, name))
        if not self.low_freq_factor < self.high_freq_factor:
            raise ValueError(f"rope_scaling needs low_freq_factor < high_freq_factor, got {self.low_freq_factor} "
                             f"and {self.high_freq_factor}")

    @classmethod
    def from_value(cls, value: object) -> RopeScaling | None:
        """None, a RopeScaling, or its fields as a dict (a record's JSON)."""
        if value is None or isinstance(value, cls):
            return value
        known = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(value, dict) or sorted(value) != sorted(known):
            raise ValueError(f"rope_scaling must be None or have exactly the fields {known}, got {value!r}")
        return cls(**value)


@dataclass(frozen=True)
class PlainConfig:
    """Model dimensions as plain values (the dtype as a name): what reading a record or a budget needs.

    The same fields, defaults and checks as DecoderConfig, which only adds the dtype as a
    torch.dtype; kept apart so that nothing that reads numbers has to import torch.
    """

    vocab_size: int = 128
    width: int = 32
    heads: int = 4
    kv_heads: int | None = None  # None means one KV head per query head (MHA)
    layers: int = 1
    max_length: int = 2048
    mlp_ratio: int = 4
    dtype: str = "float32"
    window: int | None = None  # sliding window: a query sees only the last W positions (None: all)
    family: str = "gpt2"  # which block: one of FAMILIES
    head_dim: int | None = None  # None: width // heads
    intermediate_size: int | None = None  # the MLP's hidden width; None: mlp_ratio * width
    window_pattern: str | None = None  # with a window: None (or "all") every layer slides, "alternating" even ones
    norm_eps: float = 1e-5  # LayerNorm's (gpt2) or RMSNorm's (llama) epsilon
    rope_theta: float | None = None  # llama: the rotary base (None: 10000.0); gpt2 has learned positions
    rope_scaling: RopeScaling | None = None  # llama: Llama 3.1's frequency scaling, or none
    qkv_bias: bool | None = None  # biases on q, k and v; None: the family's (gpt2 True, llama False; Qwen2 True)
    tie_embeddings: bool = False  # llama: the output head is the token embedding (gpt2: its own, with a bias)
    sinks: int = 0  # with a window: the first K positions stay visible to every query (StreamingLLM's attention sinks)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", self.dtype_value(check_dtype_name(self.dtype)))
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {list(FAMILIES)}, got {self.family!r}")
        self._check_sizes()
        self._check_family()
        self._check_window()

    def _check_sizes(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("vocab_size", "width", "heads", "kv_heads", "layers", "max_length", "mlp_ratio"):
            positive_int(name, getattr(self, name))
        if self.head_dim is None or self.family == "gpt2":  # the gpt2 block's heads split the width
            if self.width % self.heads:
                raise ValueError(f"heads must divide width: width {self.width} is not divisible by {self.heads} heads")
            if self.head_dim not in (None, self.width // self.heads):
                raise ValueError(f"the gpt2 family's head width is width / heads: expected head_dim=None or "
                                 f"{self.width // self.heads}, got {self.head_dim!r}")
            object.__setattr__(self, "head_dim", self.width // self.heads)
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", self.mlp_ratio * self.width)
        for name in ("head_dim", "intermediate_size"):
            positive_int(name, getattr(self, name), optional=True)
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads: {self.heads} heads are not divisible by {self.kv_heads} kv_heads")
        positive_number("norm_eps", self.norm_eps)

    def _check_family(self) -> None:
        object.__setattr__(self, "rope_scaling", RopeScaling.from_value(self.rope_scaling))
        if self.family == "gpt2":
            for name, value in LLAMA_ONLY.items():
                if getattr(self, name) != value:
                    raise ValueError(f"{name} belongs to the llama family (rotary positions, a tied or bias-free head): "
                                     f"expected {name}={value} for family 'gpt2', got {getattr(self, name)!r}")
            if self.qkv_bias is False:
                raise ValueError("the gpt2 family has a bias on every projection: expected qkv_bias=True or None, "
                                 "got False")
            object.__setattr__(self, "qkv_bias", True)
            return
        if self.rope_theta is None:
            object.__setattr__(self, "rope_theta", 10000.0)
        positive_number("rope_theta", self.rope_theta)
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        if self.head_dim % 2:
            raise ValueError(f"rotary positions turn pairs of channels: expected an even head_dim, got {self.head_dim}")
        for name in ("qkv_bias", "tie_embeddings"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        object.__setattr__(self, "qkv_bias", bool(self.qkv_bias))

    def _check_window(self) -> None:
        positive_int("window", self.window, optional=True)
        if self.window_pattern is not None and self.window_pattern not in WINDOW_PATTERNS:
            raise ValueError(f"window_pattern must be one of {list(WINDOW_PATTERNS)} or None, got {self.window_pattern!r}")
        if self.window is None and self.window_pattern is not None:
            raise ValueError(f"window_pattern {self.window_pattern!r} needs a sliding window: expected window=W, "
                             "got window=None")
        positive_int("sinks", self.sinks, lowest=0)
        if self.sinks and self.window is None:
            raise ValueError(f"sinks {self.sinks} are kept beside a sliding window: expected window=W, got window=None")
        if self.window_pattern == "all":  # the same model as None: one way to write it, so configs compare equal
            object.__setattr__(self, "window_pattern", None)

    @staticmethod
    def dtype_value(name: str) -> object:
        """What the dtype field holds, from its checked name: here the name itself."""
        return name

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[dtype_name(self.dtype)]

    @property
    def sliding_layers(self) -> int:
        """How many layers slide over the window, counted without listing them (a budget may name 10**8 layers)."""
        if self.window is None:
            return 0
        return (self.layers + 1) // 2 if self.window_pattern == "alternating" else self.layers

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's window: W on a sliding layer, None on a layer that sees every earlier position."""
        if self.window is None:
            return (None,) * self.layers
        if self.window_pattern == "alternating":
            return tuple(self.window if layer % 2 == 0 else None for layer in range(self.layers))
        return (self.window,) * self.layers

    def to_dict(self) -> dict:
        """Every field, the dtype as its name; head_dim and intermediate_size as None where they are the
        derived width / heads and mlp_ratio x width, so that a dict with another width derives them again."""
        fields = dataclasses.asdict(self)
        fields["dtype"] = dtype_name(self.dtype)
        if self.heads * self.head_dim == self.width:
            fields["head_dim"] = None
        if self.intermediate_size == self.mlp_ratio * self.width:
            fields["intermediate_size"] = None
        if not self.sinks:  # absent unless used: a config without sinks reads, compares and exports as before them
            del fields["sinks"]
        return fields

    @classmethod
    def from_dict(cls, fields: dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"unknown DecoderConfig fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**fields)

    @classmethod
    def from_preset(cls, name: str, **overrides):
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})


@dataclass(frozen=True)
class DecoderConfig(PlainConfig):
    """Model dimensions. The defaults are the source document's lab; `dtype` is a torch.dtype."""

    @staticmethod
    def dtype_value(name: str) -> object:
        return parse_dtype(name)


# Presets are data: a name and the fields it overrides, with each published model's source beside it.
PRESETS_PATH = Path(__file__).parent / "data" / "presets.toml"
PRESETS: dict[str, dict] = tomllib.loads(PRESETS_PATH.read_text(encoding="utf-8"))


def preset_config(name: str, **overrides) -> DecoderConfig:
    return DecoderConfig.from_preset(name, **overrides)
