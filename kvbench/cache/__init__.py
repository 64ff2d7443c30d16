"""Key/value caches: one request's retained keys and values, held by the caller.

Every kind implements the protocol of :class:`kvbench.cache.base.Cache`, which
``Decoder.forward`` drives, and passes the same contract tests. ``make_cache`` builds
a fresh cache of a kind by name.
"""

from __future__ import annotations

from kvbench.cache.base import Cache, expected_cache_bytes
from kvbench.cache.contiguous import ConcatCache, StaticCache
from kvbench.cache.paged import BlockPool, PagedCache
from kvbench.cache.quantized import QuantizedCache, QuantizedInt4Cache, quantized_cache_bytes
from kvbench.cache.window import WindowCache
from kvbench.config import DecoderConfig
from kvbench.kinds import CACHE_KINDS, CONTROL, FULL, KIND_NAME

# The kinds kvbench ships (kvbench.kinds.CACHE_KINDS names them); register_kind adds others for this process.
KINDS: dict[str, type[Cache]] = {kind.kind: kind for kind in (
    ConcatCache, StaticCache, PagedCache, QuantizedCache, QuantizedInt4Cache, WindowCache)}

__all__ = ["CACHE_KINDS", "KIND_NAME", "KINDS", "BlockPool", "Cache", "ConcatCache", "PagedCache", "QuantizedCache",
           "QuantizedInt4Cache", "StaticCache", "WindowCache", "expected_bytes", "expected_cache_bytes", "make_cache",
           "quantized_cache_bytes", "register_kind"]


def register_kind(name: str, factory: type[Cache]) -> None:
    """Make a cache kind of your own available by name to make_cache, the gate, `kvbench run`
    (through --plugin) and the report. `factory` is a Cache subclass: the gate reads its `exact`
    and `drift_limits`, the memory probe its `expected_bytes`; `factory(config, batch, capacity)`
    returns a fresh cache."""
    if not isinstance(name, str) or not KIND_NAME.fullmatch(name) or name in (FULL, CONTROL):
        raise ValueError(f"a kind name is a plain lowercase word (letters, digits, '-', '_'), not 'full' or "
                         f"'control', got {name!r}")
    if KINDS.get(name, factory) is not factory:
        raise ValueError(f"cache kind {name!r} is already registered (as {KINDS[name].__name__})")
    if not (isinstance(factory, type) and issubclass(factory, Cache)):
        raise ValueError(f"a cache kind must be a subclass of kvbench.cache.Cache, got {factory!r}")
    KINDS[name] = factory


def expected_bytes(kind: str, config: DecoderConfig, batch: int, length: int, **options) -> int:
    """The bytes a `kind` cache retains for `length` positions, by its own formula."""
    if kind not in KINDS:
        raise ValueError(f"cache kind must be one of {list(KINDS)}, got {kind!r}")
    return KINDS[kind].expected_bytes(config, batch, length, **options)


def make_cache(kind: str, config: DecoderConfig, batch: int = 1, capacity: int | None = None, **options) -> Cache:
    """A fresh, empty cache of `kind` for one request of `batch` sequences."""
    if kind not in KINDS:
        raise ValueError(f"cache kind must be one of {list(KINDS)}, got {kind!r}")
    return KINDS[kind](config, batch, capacity, **options)
