"""Key/value caches: one request's retained keys and values, held by the caller.

Every kind implements the protocol of :class:`kvbench.cache.base.Cache`, which
``Decoder.forward`` drives, and passes the same contract tests. ``make_cache`` builds
a fresh cache of a kind by name.
"""

from __future__ import annotations

from kvbench.cache.base import Cache, expected_cache_bytes
from kvbench.cache.contiguous import ConcatCache, StaticCache
from kvbench.cache.paged import BlockPool, PagedCache
from kvbench.config import DecoderConfig

KINDS: dict[str, type[Cache]] = {"concat": ConcatCache, "static": StaticCache, "paged": PagedCache}
CACHE_KINDS = tuple(KINDS)

__all__ = ["CACHE_KINDS", "KINDS", "BlockPool", "Cache", "ConcatCache", "PagedCache", "StaticCache",
           "expected_cache_bytes", "make_cache"]


def make_cache(kind: str, config: DecoderConfig, batch: int = 1, capacity: int | None = None, **options) -> Cache:
    """A fresh, empty cache of `kind` for one request of `batch` sequences."""
    if kind not in KINDS:
        raise ValueError(f"cache kind must be one of {list(KINDS)}, got {kind!r}")
    return KINDS[kind](config, batch, capacity, **options)
