"""Model dimensions: the floor every other module builds on (model and cache both import it).

`DecoderConfig`'s defaults are the source document's lab; presets are data, a name and
the fields it overrides. Derived values (head width, key/value heads) are properties or
filled in at construction, so a config is always complete and checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        if value not in DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype_name(value)}")
        return value
    if value not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {value!r}")
    return DTYPES[value]


@dataclass(frozen=True)
class DecoderConfig:
    """Model dimensions. The defaults are the source document's lab."""

    vocab_size: int = 128
    width: int = 32
    heads: int = 4
    kv_heads: int | None = None  # None means one KV head per query head (MHA)
    layers: int = 1
    max_length: int = 2048
    mlp_ratio: int = 4
    dtype: torch.dtype = torch.float32
    window: int | None = None  # sliding window: a query sees only the last W positions (None: all)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
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

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def to_dict(self) -> dict:
        fields = dataclasses.asdict(self)
        fields["dtype"] = dtype_name(self.dtype)
        return fields

    @classmethod
    def from_dict(cls, fields: dict) -> "DecoderConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"unknown DecoderConfig fields {unknown}; expected a subset of {sorted(known)}")
        return cls(**fields)


# Presets are data: a name and the fields it overrides.
PRESETS: dict[str, dict] = {
    "seed": {},
    "medium": {"width": 256, "heads": 8, "layers": 4, "max_length": 4096},
}


def preset_config(name: str, **overrides) -> DecoderConfig:
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return DecoderConfig(**{**PRESETS[name], **overrides})
