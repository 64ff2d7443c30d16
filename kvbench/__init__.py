"""kvbench: what a KV cache saves, measured against full-prefix decoding, with an equivalence gate."""

__version__ = "0.1.0"
