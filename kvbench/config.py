"""Model dimensions: the floor every other module builds on (model and cache both import it).

`DecoderConfig`'s defaults are the source document's lab; presets are data, a name and
the fields it overrides. Derived values (head width, key/value heads) are properties or
filled in at construction, so a config is always complete and checked. torch is imported
only to turn a dtype name into a torch.dtype: `PlainConfig` has the same fields and checks
with the dtype as a name, for everything that only reads numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DTYPE_NAMES = ("bfloat16", "float16", "float32", "float64")
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", self.dtype_value(check_dtype_name(self.dtype)))
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        for name in ("vocab_size", "width", "heads", "kv_heads", "layers", "max_length", "mlp_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ValueError(f"window must be a positive integer or None, got {self.window!r}")
        if self.width % self.heads:
            raise ValueError(f"heads must divide width: width {self.width} is not divisible by {self.heads} heads")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads: {self.heads} heads are not divisible by {self.kv_heads} kv_heads")

    @staticmethod
    def dtype_value(name: str) -> object:
        """What the dtype field holds, from its checked name: here the name itself."""
        return name

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[dtype_name(self.dtype)]

    def to_dict(self) -> dict:
        fields = dataclasses.asdict(self)
        fields["dtype"] = dtype_name(self.dtype)
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


# Presets are data: a name and the fields it overrides.
PRESETS: dict[str, dict] = {
    "seed": {},
    "medium": {"width": 256, "heads": 8, "layers": 4, "max_length": 4096},
}


def preset_config(name: str, **overrides) -> DecoderConfig:
    return DecoderConfig.from_preset(name, **overrides)
