"""Key/value caches: one request's retained keys and values, held by the caller.

Every kind implements the protocol of :class:`kvbench.cache.base.Cache`, which
``Decoder.forward`` drives, and passes the same contract tests. ``make_cache`` builds
a fresh cache of a kind by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping

import torch

from kvbench import modes
from kvbench.cache.base import Cache, expected_cache_bytes
from kvbench.cache.contiguous import ConcatCache, StaticCache
from kvbench.cache.evicting import EvictingCache
from kvbench.cache.paged import BlockPool, PagedCache
from kvbench.cache.quantized import QuantizedCache, QuantizedInt4Cache
from kvbench.cache.window import WindowCache
from kvbench.config import DecoderConfig
from kvbench.kinds import quantized_cache_bytes  # the cache package's byte formulas, beside expected_cache_bytes
from kvbench.modes import CACHE_KINDS, KIND_NAME, expected_bytes


class Kinds(MutableMapping):
    """kind -> its cache class: a view of the mode registry (kvbench.modes) over the modes that make a kvbench
    cache, the shipped kinds first. Setting a kind registers a plugin's spec for its class (register_kind)."""

    def __getitem__(self, name: str) -> type[Cache]:
        found = modes.SPECS.get(name)
        if found is None or found.cache is None:
            raise KeyError(name)
        return found.cache_factory()

    def __iter__(self):
        return iter(modes.names(modes.KVBENCH, modes.PLUGIN))

    def __len__(self) -> int:
        return len(modes.names(modes.KVBENCH, modes.PLUGIN))

    def __setitem__(self, name: str, factory: type[Cache]) -> None:
        """A kind already registered keeps its spec with another class (a test's stand-in); a new one is a plugin's."""
        found = modes.SPECS.get(name)
        spec = modes.spec_of_cache(name, factory) if found is None else dataclasses.replace(found, cache=factory)
        modes.register(spec, replace_existing=True)

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        modes.unregister(name)


KINDS = Kinds()

__all__ = ["CACHE_KINDS", "KIND_NAME", "KINDS", "BlockPool", "Cache", "ConcatCache", "EvictingCache", "PagedCache", "QuantizedCache",
           "QuantizedInt4Cache", "StaticCache", "WindowCache", "expected_bytes", "expected_cache_bytes", "make_cache",
           "quantized_cache_bytes", "register_kind"]


def register_kind(name: str, factory: type[Cache]) -> None:
    """Make a cache kind of your own available by name to make_cache, the gate, `kvbench run`
    (through --plugin) and the report: a plugin spec (kvbench.modes.spec_of_cache) from `factory`, a Cache
    subclass. It inherits the spec of the kind it extends; its class may set `exact = False` with
    `drift_limits` (and `family_drift_limits`), and an `expected_bytes(config, batch, length, **options)`
    classmethod; `factory(config, batch, capacity, **options)` returns a fresh cache. A plugin may instead
    register a kvbench.modes.ModeSpec itself."""
    modes.check_name(name)
    if not (isinstance(factory, type) and issubclass(factory, Cache)):
        raise ValueError(f"a cache kind must be a subclass of kvbench.cache.Cache, got {factory!r}")
    if name in modes.SPECS and modes.SPECS[name].cache is not factory:
        raise ValueError(f"cache kind {name!r} is already registered (as {modes.describe_source(modes.SPECS[name])})")
    modes.register(modes.spec_of_cache(name, factory))


def make_cache(kind: str, config: DecoderConfig, batch: int = 1, capacity: int | None = None, device=None,
               **options) -> Cache:
    """A fresh, empty cache of `kind` for one request of `batch` sequences, its storage on `device` (the model's:
    `model.device`; None is the CPU)."""
    if kind not in KINDS:
        raise ValueError(f"cache kind must be one of {list(KINDS)}, got {kind!r}")
    # Passed only off the CPU, every kind's default: a plugin's kind written before devices keeps working there.
    if device is not None and torch.device(device).type != "cpu":
        options = {**options, "device": device}
    return KINDS[kind](config, batch, capacity, **options)
