"""Every mode a run can name, described once: a ModeSpec per mode, in one registry plugins register into.

A mode is a way of decoding the same token ids: `full` re-runs the whole prefix at every step,
a kvbench cache kind keeps keys and values between steps, a transformers cache does the same in
transformers' own model on the same weights, and a plugin adds a kind of its own. Everything kvbench
asks of a mode is answered by its spec: whether the gate holds it to the dtype's tolerance or to its
own drift limits, the bytes it retains, the options and the model it requires (the command line's
checks), whether it computes with a second copy of the weights (the memory estimate), how asv shapes
its model, whether it changes what is kept (the report), and the stepper that runs it.

Torch-free, like kvbench.kinds (whose arithmetic the specs are built from): reading a record, a
budget or the command line never waits for torch. The cache classes and steppers are named by
import path and imported when a mode first runs.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable

from kvbench import kinds
from kvbench.kinds import (EVICTION_OPTIONS, GROUP_SIZE, KIND_NAME, RESIDUAL, SNAPKV_WINDOW, expected_cache_bytes,
                           quantized_cache_bytes, scored_cache_bytes, scored_reserved_bytes, window_cache_bytes)

FULL = "full"  # the baseline: re-runs the whole prefix at every step
CONTROL = "control"  # the A/A label: a cached mode timed a second time in the same rotations
# Where a mode's steps come from.
FULL_PREFIX, KVBENCH, TRANSFORMERS, PLUGIN = "full", "kvbench", "transformers", "plugin"
SOURCES = (FULL_PREFIX, KVBENCH, TRANSFORMERS, PLUGIN)
QUANTIZED_OPTIONS = ("group_size", "residual")  # --quant-group and --quant-residual
RESERVE, PAGES = "reserve", "pages"  # how a serving run holds a kind under its budget (ModeSpec.serving)
SERVING = (None, RESERVE, PAGES)


def float_bytes(config, batch: int, length: int, **options) -> int:
    """Every position's keys and values in the model's dtype (kvbench.kinds.expected_cache_bytes)."""
    return expected_cache_bytes(config, batch, length)


def quantized_bytes(config, batch: int, length: int, bits: int, group_size: int = GROUP_SIZE,
                    residual: int = RESIDUAL, **options) -> int:
    return quantized_cache_bytes(config, batch, length, bits, group_size, residual)


def windowed_bytes(config, batch: int, length: int, **options) -> int:
    return window_cache_bytes(config, batch, length)


def resolve(target: str | Callable) -> Callable:
    """A class or function given directly, or named "module:attribute" and imported on first use."""
    if not isinstance(target, str):
        return target
    return imported(target)


@functools.cache
def imported(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ModeSpec:
    """One mode, whole. `bytes(config, batch, length, **options)` is its byte formula; None means its
    bytes are what the footprint measures (transformers' caches, whose layout kvbench does not own)."""

    name: str
    source: str  # one of SOURCES
    exact: bool = True  # held to the dtype's tolerance; a lossy mode to its drift limits instead
    drift_limits: Mapping | None = None  # a lossy mode's limits (kvbench.kinds.DRIFT_METRICS) on any family...
    family_drift_limits: Mapping = field(default_factory=dict)  # ...unless its family has its own
    trained_drift_limits: Mapping | None = None  # ...or on a trained model's weights, where they differ (drift.md)
    bytes: Callable[..., int] | None = float_bytes
    options: tuple[str, ...] = ()  # the cache options it takes, by keyword
    requires_window: bool = False  # the model must have a sliding window (DecoderConfig(window=W))
    families: tuple[str, ...] | None = None  # the model families it runs on (None: every family)
    keeps_state: bool = True  # False: every step is computed afresh (full), so its last step alone ends a loop
    keeps_every_position: bool = True  # False: it evicts positions (a window), so it changes what is kept
    # Drops positions by a rule of its own (kvbench.cache.evicting), on any model: the gate holds it to the full path
    # masked to exactly the positions it kept at each step, and quality runs it on the full model. The window kind
    # is not one: its model's window is the rule, so its full path is the masked one (requires_window).
    evicts: bool = False
    # Compresses its prompt when the first decoding step comes (kvbench.cache.scored): the gate runs it as a request
    # whose prompt is the first half of the ids, so that what it keeps after a compression is what is judged.
    compresses_prompt: bool = False
    # How a serving run holds it under a KV budget (kvbench.serving.admission): "reserve" sets a request's capacity
    # aside at admission, "pages" takes blocks of a shared pool on demand; None: it is not served.
    serving: str | None = None
    # A reserving kind whose need falls as it runs (compresses_prompt): (config, capacity, prompt, **options) -> the
    # most its cache for one request holds, reserved at admission; None: its byte formula at its capacity.
    reserve: Callable[..., int] | None = None
    copies_weights: bool = False  # computes with a second copy of the weights (transformers' model)
    default: bool = False  # among `kvbench run`'s default modes
    asv_config: Mapping = field(default_factory=dict)  # config overrides of the model asv times it on
    cache: str | type | None = None  # its cache class, or "module:Class" (None: full, transformers)
    stepper: str | Callable = "kvbench.workloads.decode:cache_steps"  # (model, ids, mode, prompt, cache, options)
    check: str | Callable | None = None  # (mode, config) -> None or ValueError: what needs an import to know
    bits: int | None = None  # bits per quantized element
    backend: str | None = None  # transformers' cache class or QuantizedCache backend
    compiled: bool = False  # its one-token steps run through torch.compile (kvbench.models.compiled): compiled once

    @property
    def changes_representation(self) -> bool:
        """Lossy, or keeps fewer positions than it was given: the report sets bytes beside drift and time."""
        return not self.exact or not self.keeps_every_position

    def limits_for(self, config, trained: bool = False) -> dict | None:
        """The drift limits a lossy mode is judged by on a model of `config` (a family may drift more), with
        trained weights (kvbench.models.gguf) its trained limits where it has them."""
        limits = self.family_drift_limits.get(config.family, self.drift_limits)
        if trained and self.trained_drift_limits is not None:
            limits = self.trained_drift_limits
        return None if limits is None else dict(limits)

    def __post_init__(self) -> None:
        if self.evicts and self.keeps_every_position:
            raise ValueError(f"mode {self.name!r} evicts: expected keeps_every_position=False, got True")
        if self.serving not in SERVING:
            raise ValueError(f"mode {self.name!r}: serving is one of {list(SERVING)}, got {self.serving!r}")

    def require(self, config) -> None:
        """ValueError unless this mode can run on a model of `config`: its lazy `check` first (its words are the
        ones users know), then the family and the window it requires."""
        if self.check is not None:
            resolve(self.check)(self.name, config)
        if self.families is not None and config.family not in self.families:
            raise ValueError(f"{self.name} runs on the {' or '.join(self.families)} family, got family "
                             f"{config.family!r}")
        if self.requires_window and config.window is None:
            raise ValueError(f"{self.name} needs a model with a sliding window (--window W, DecoderConfig(window=W)), "
                             "got window=None")
        if self.evicts and config.window is not None:
            raise ValueError(f"{self.name} evicts by its own rule and needs full attention (its gate masks the full "
                             f"path to what it kept): expected a model without --window, got window={config.window}")

    def cache_factory(self) -> type:
        if self.cache is None:
            raise ValueError(f"mode {self.name!r} makes no kvbench cache (its source is {self.source})")
        return resolve(self.cache)

    def steps(self) -> Callable:
        return resolve(self.stepper)


# -- the registry ------------------------------------------------------------------------------

_specs: dict[str, ModeSpec] = {}
SPECS: Mapping[str, ModeSpec] = MappingProxyType(_specs)  # name -> spec, in the order registered


def register(spec: ModeSpec, replace_existing: bool = False) -> ModeSpec:
    """Add a mode; ValueError for a name that is not a plain word, a name taken, or an unknown source."""
    if not isinstance(spec, ModeSpec):
        raise ValueError(f"expected a kvbench.modes.ModeSpec, got {spec!r}")
    check_name(spec.name, spec.source)
    if spec.source not in SOURCES:
        raise ValueError(f"a mode's source is one of {list(SOURCES)}, got {spec.source!r}")
    if not spec.exact and not (spec.drift_limits or spec.family_drift_limits):
        raise ValueError(f"lossy mode {spec.name!r} needs drift limits to be judged by, got none")
    if spec.name in _specs and not replace_existing and _specs[spec.name] != spec:
        raise ValueError(f"mode {spec.name!r} is already registered (as {describe_source(_specs[spec.name])})")
    _specs[spec.name] = spec
    return spec


def check_name(name: str, source: str = PLUGIN) -> None:
    """A mode's name is a plain word (nothing a terminal, markdown or HTML interprets), and only the baseline is
    called full; no mode is called control (the A/A label)."""
    if not isinstance(name, str) or not KIND_NAME.fullmatch(name) or (source != FULL_PREFIX and name in (FULL, CONTROL)):
        raise ValueError(f"a kind name is a plain lowercase word (letters, digits, '-', '_'), not 'full' or "
                         f"'control', got {name!r}")


def unregister(name: str) -> ModeSpec:
    return _specs.pop(name)


def describe_source(spec: ModeSpec) -> str:
    return getattr(resolve(spec.cache), "__name__", str(spec.cache)) if spec.cache is not None else spec.source


def spec(name: str) -> ModeSpec:
    """The spec of a mode registered in this process, or ValueError naming the known ones."""
    try:
        return _specs[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown mode {name!r}: expected one of {list(_specs)}") from None


def names(*sources: str) -> tuple[str, ...]:
    """Registered modes, in order, of the given sources (every source when none is given)."""
    return tuple(name for name, found in _specs.items() if not sources or found.source in sources)


def source_of(name: str) -> str:
    """A mode's source; a name not registered here is a plugin's (a record read without its plugin)."""
    found = _specs.get(name)
    return found.source if found is not None else PLUGIN


def changes_representation(name: str, check: dict | None) -> bool:
    """Whether a mode changes what is kept: by its spec, or for a plugin's kind not loaded here by its check."""
    found = _specs.get(name)
    if found is None:
        return bool(check) and check.get("exact", True) is False
    return found.changes_representation


def check_modes(modes: list[str] | tuple[str, ...], known: tuple[str, ...] | None = None) -> list[str]:
    """The modes as a list, or ValueError naming the first unknown or repeated one."""
    known = names() if known is None else known
    modes = list(modes)
    if not modes:
        raise ValueError(f"at least one mode is required, choose from {list(known)}")
    unknown = [m for m in modes if m not in known]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}: expected one of {list(known)}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"modes must be distinct, got {modes}")
    return modes


def expected_bytes(mode: str, config, batch: int, length: int, measured: int | None = None,
                   nominal: bool = False, **options) -> int:
    """The bytes `mode` retains for `length` positions of `batch` sequences, by its spec's formula: the one
    answer kvbench has. A mode without a formula (transformers' caches), or a plugin's kind read where the
    plugin is not loaded, retains what was `measured`; without that, ValueError. `nominal` asks instead, for a
    transformers cache, what kvbench's kind of the same bits holds (what a step must read, for the limits)."""
    found = _specs.get(mode)
    if found is not None and found.bytes is not None:
        return found.bytes(config, batch, length, **options)
    if nominal and found is not None:
        if found.bits:
            return quantized_bytes(config, batch, length, bits=found.bits, **options)
        return float_bytes(config, batch, length)
    if measured is None:
        raise ValueError(f"no byte formula for mode {mode!r}: expected one of "
                         f"{[name for name, s in _specs.items() if s.bytes is not None]}, or a measured size")
    return measured


def quantized_positions(mode: str, length: int, recorded: int | None = None, **options) -> int | None:
    """Positions `mode` held quantized after `length`: what was `recorded` (the cache's own count), else for
    kvbench's quantized kinds their rule (kvbench.kinds.quantized_positions: what the caches do, their bytes
    checked against it); None for a kind that keeps what it is given, or one whose rule is not kvbench's
    (transformers' caches, a plugin's) when nothing was recorded."""
    if recorded is not None:
        return recorded
    found = _specs.get(mode)
    if found is None or not found.bits or found.source != KVBENCH:
        return None
    return kinds.quantized_positions(length, **{name: options[name] for name in QUANTIZED_OPTIONS if name in options})


def spec_of_cache(name: str, factory: type) -> ModeSpec:
    """A plugin kind's spec from its Cache subclass: the spec of the registered kind it extends (its formula,
    options, requirements, asv model), with what its own class sets: `exact`, `drift_limits`,
    `family_drift_limits`, `trained_drift_limits`, an `expected_bytes` classmethod, `evicts` (an evicting kind's)."""
    registered: dict[type, ModeSpec] = {}
    for found in _specs.values():  # a class's first spec: static, not static-compiled, which steps it otherwise
        if found.cache is not None and found.source in (KVBENCH, PLUGIN):
            registered.setdefault(resolve(found.cache), found)
    parent = next((registered[klass] for klass in factory.__mro__ if klass in registered), None)
    base = parent if parent is not None else ModeSpec(name, PLUGIN)
    below = factory.__mro__[: factory.__mro__.index(resolve(base.cache))] if parent else factory.__mro__
    own: dict = {}
    for klass in reversed(below):  # the Cache base sets none of these: a kind's facts are its spec's
        own.update(vars(klass))
    fields = {"name": name, "source": PLUGIN, "cache": factory, "default": False}
    if "exact" in own:
        fields["exact"] = own["exact"]
    if "drift_limits" in own or "family_drift_limits" in own:
        fields.update(drift_limits=own.get("drift_limits"), family_drift_limits=own.get("family_drift_limits") or {})
    if "trained_drift_limits" in own:
        fields["trained_drift_limits"] = own["trained_drift_limits"]
    if "expected_bytes" in own:
        fields["bytes"] = factory.expected_bytes
    if own.get("evicts"):  # a kvbench.cache.evicting.EvictingCache: gated against the full path masked to what it kept
        fields.update(evicts=True, keeps_every_position=False)
    return replace(base, **fields)


# -- the modes kvbench ships ---------------------------------------------------------------------

# The quantized kinds are judged by these, not by the exact gate (docs/drift.md): the largest logit difference,
# the mean and largest KL divergence (nats) of next-token distributions, how often the top token agrees. int8:
# about 10x the worst seen on the seed and medium presets (seeds 0-2, T up to 2048, G=4/R=3 and the defaults),
# so a correct cache passes with room and a wrong scale or group does not. The llama family drifts more: its
# keys are quantized after rotation, which spreads a channel's range over positions, and its logits are larger.
# About 10x the worst seen on the llama, qwen, mistral and gemma tiny presets (seeds 0-2, T up to 1024, G=4/R=3
# and the defaults) and llama-mini (T up to 512): |diff| 7.4e-3, KL mean 1.2e-6, KL max 3.0e-6, top-1 0.984
# (one disagreement in 64 steps).
INT8_LIMITS = MappingProxyType({"max_abs_diff": 5e-3, "kl_mean": 5e-8, "kl_max": 1e-7, "top1_agreement": 0.99})
INT8_FAMILY_LIMITS = MappingProxyType({"llama": MappingProxyType(
    {"max_abs_diff": 7.5e-2, "kl_mean": 1.2e-5, "kl_max": 3e-5, "top1_agreement": 0.98})})
# int4, worst seen: max |diff| 4.6e-3, KL mean 3.8e-7, KL max 1.6e-6; top-1 0.94 (one near-tie in 16 steps).
INT4_LIMITS = MappingProxyType({"max_abs_diff": 5e-2, "kl_mean": 1e-5, "kl_max": 5e-5, "top1_agreement": 0.9})
# llama family, worst seen as above: |diff| 0.13, KL mean 3.7e-4, KL max 8.7e-4, top-1 0.969 (2 in 64).
INT4_FAMILY_LIMITS = MappingProxyType({"llama": MappingProxyType(
    {"max_abs_diff": 1.0, "kl_mean": 4e-3, "kl_max": 1e-2, "top1_agreement": 0.9})})
# Trained weights (SmolLM2-135M on corpus text, G=R=16, 4 x 128 tokens, results/real/quality-quantized.json):
# int8 worst |diff| 0.275, KL max 1.4e-3, KL mean 1.7e-5, top-1 0.998; int4 worst |diff| 3.0, KL max 0.82,
# KL mean 5.2e-3, top-1 0.971. About 3x, top-1 with room for one flip in 50.
INT8_TRAINED_LIMITS = MappingProxyType({"max_abs_diff": 1.0, "kl_mean": 5e-5, "kl_max": 5e-3, "top1_agreement": 0.98})
INT4_TRAINED_LIMITS = MappingProxyType({"max_abs_diff": 10.0, "kl_mean": 2e-2, "kl_max": 3.0, "top1_agreement": 0.9})
QUANTIZED = {8: (INT8_LIMITS, INT8_FAMILY_LIMITS, INT8_TRAINED_LIMITS),
             4: (INT4_LIMITS, INT4_FAMILY_LIMITS, INT4_TRAINED_LIMITS)}
ASV_WINDOW = 32  # asv times the window kind on a model that attends to the last 32 positions


def quantized(name: str, source: str, bits: int, **fields) -> ModeSpec:
    limits, family_limits, trained_limits = QUANTIZED[bits]
    return ModeSpec(name, source, exact=False, drift_limits=limits, family_drift_limits=family_limits,
                    trained_drift_limits=trained_limits,
                    bits=bits, options=QUANTIZED_OPTIONS, **fields)


def transformers_cache(name: str, backend: str, **fields) -> ModeSpec:
    """transformers' own cache on the same weights (kvbench.models.hf; the llama family, the hf extra)."""
    base = dict(bytes=None, families=("llama",), copies_weights=True, stepper="kvbench.models.hf:steps",
                check="kvbench.models.hf:require_mode", backend=backend)
    if "bits" in fields:  # a lossy one is judged by the limits of kvbench's kind of the same bits
        return quantized(name, TRANSFORMERS, **base, **fields)
    return ModeSpec(name, TRANSFORMERS, **base, **fields)


# The score-based evicting kinds (kvbench.cache.scored, docs/eviction.md): kvpress's presses, each keeping the top-k
# positions of every key/value head after the prompt. Their mechanics are exact (the gate holds them to the full
# path masked to what they kept, from the prompt on); what they forget is measured by quality and the needle task.
SCORED_KINDS = (("knorm", "knorm", "KnormCache"), ("snapkv", "snapkv", "SnapKVCache"), ("tova", "tova", "TovaCache"),
                ("h2o", "h2o", "H2OCache"), ("pyramidkv", "pyramidkv", "PyramidKVCache"),
                ("streamingllm", "streamingllm", "StreamingLLMCache"), ("random", "random", "RandomCache"))


# What each keeps to score with beside its positions (its class's state_kept(); tests/test_admission.py holds
# them equal): the newest queries (a kind that scores from them), a running score per position (h2o).
SCORED_STATE = {"snapkv": {"observation": SNAPKV_WINDOW}, "pyramidkv": {"observation": SNAPKV_WINDOW},
                "tova": {"observation": 1}, "h2o": {"totals": True}}


def scored(name: str, cache: str, pyramid: bool = False) -> ModeSpec:
    """Served by reserving its uncompressed prompt at admission and giving back what its compression frees."""
    return ModeSpec(name, KVBENCH, cache=cache, bytes=functools.partial(scored_cache_bytes, pyramid=pyramid),
                    options=EVICTION_OPTIONS, keeps_every_position=False, evicts=True, compresses_prompt=True,
                    serving=RESERVE, reserve=functools.partial(scored_reserved_bytes, pyramid=pyramid,
                                                               **SCORED_STATE.get(name, {})))


for _spec in (
    ModeSpec(FULL, FULL_PREFIX, stepper="kvbench.workloads.decode:full_steps", keeps_state=False, default=True),
    ModeSpec("concat", KVBENCH, cache="kvbench.cache.contiguous:ConcatCache", default=True),
    ModeSpec("static", KVBENCH, cache="kvbench.cache.contiguous:StaticCache", default=True, serving=RESERVE),
    ModeSpec("paged", KVBENCH, cache="kvbench.cache.paged:PagedCache", default=True, serving=PAGES),
    quantized("quantized-int8", KVBENCH, 8, cache="kvbench.cache.quantized:QuantizedCache",
              bytes=functools.partial(quantized_bytes, bits=8), serving=RESERVE),
    quantized("quantized-int4", KVBENCH, 4, cache="kvbench.cache.quantized:QuantizedInt4Cache",
              bytes=functools.partial(quantized_bytes, bits=4), serving=RESERVE),
    ModeSpec("window", KVBENCH, cache="kvbench.cache.window:WindowCache", bytes=windowed_bytes,
             requires_window=True, keeps_every_position=False, asv_config=MappingProxyType({"window": ASV_WINDOW})),
    *(scored(name, f"kvbench.cache.scoring.{module}:{klass}", pyramid=name == "pyramidkv")
      for name, module, klass in SCORED_KINDS),
    transformers_cache("hf-dynamic", "DynamicCache"),
    transformers_cache("hf-static", "StaticCache"),
    transformers_cache("hf-quantized-int4", "quanto", bits=4),
    transformers_cache("hf-quantized-int8", "hqq", bits=8),
    # One-token steps compiled by torch.compile's inductor (docs/compiled.md): kvbench's static cache stepped by a
    # fixed-shape functional step, and transformers' StaticCache with its forward compiled. Exact; they need a
    # C++ compiler and the llama family.
    ModeSpec("static-compiled", KVBENCH, cache="kvbench.cache.contiguous:StaticCache", families=("llama",),
             stepper="kvbench.models.compiled:mode_steps", check="kvbench.kinds:require_compiled", compiled=True),
    transformers_cache("hf-static-compiled", "StaticCache", compiled=True),
):
    register(_spec)

# Views of the shipped registry, for torch-free readers and the command line's help. A compiled mode is run
# by name only: the sweeps over every kind (contract tests, asv) would pay a compile (a minute) for each.
MODES = tuple(name for name in names(FULL_PREFIX, KVBENCH) if not _specs[name].compiled)  # kvbench's own modes
CACHE_KINDS = tuple(name for name in names(KVBENCH) if not _specs[name].compiled)  # the cache kinds kvbench ships
DEFAULT_MODES = tuple(name for name in MODES if _specs[name].default)
HF_MODES = names(TRANSFORMERS)
RUNNABLE = names()  # every mode a run may name, but a plugin's
