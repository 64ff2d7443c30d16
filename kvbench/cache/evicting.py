"""The seam for evicting kinds: a cache that keeps the positions its policy retains, each with its absolute position.

An evicting kind (StreamingLLM past its window, H2O, TOVA, SnapKV, a key-norm rule) decides after each step which
positions it no longer needs. The source document's caution holds: "evicted blocks ... require additional
position metadata". So every retained key carries its absolute position (`positions(layer)`), and a step's
attention mask is built from those positions (`key_positions`, kvbench.attention.visibility), never from an
index into the cache; a new token's position is still `length` (the positions appended), so its rotary angle or
learned embedding is the one the full path gives it.

A subclass writes one method, `choose(layer, positions, scores)`: the absolute positions to drop from a layer
once the step commits (None: none). A kind that keeps its own positions per key/value head (`per_head`, the
score-based kinds of kvbench.cache.scored, which keep each head's top-k as kvpress does) holds positions (B, KVH,
T_kept) instead of (T_kept,) and writes `choose_per_head(layer, stage)`: which staged entries each head keeps. A kind that scores positions sets `wants_scores` (kvbench.attention.SCORES):
the model then computes the attention weights of each layer's step and hands them to `observe`, which adds them
to a running total per retained key and KV head (`scores(layer)`: H2O's accumulated attention); the step's own
are `last_scores[layer]` (TOVA's row, SnapKV's observation window). A kind that leaves `wants_scores` None gets
no weights computed for it.

A step is a transaction as for every kind: update() stages the retained keys plus the new ones; commit() asks
choose() for every layer's answer, checks them all, and only then swaps the staged state in; rollback() forgets
the stage. `evict(positions)` drops positions between steps, checked first, so a refused call changes nothing.

`history`, when a list (None by default: it grows with the square of the length), gets one entry per committed
step: the step's new positions and, per layer, the positions its keys had. kvbench.workloads.decode builds the
gate's reference from it: the full path masked to exactly the positions the kind kept (its mechanics are exact;
what the eviction does to the text is measured by kvbench.workloads.quality).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.attention import QUERIES, SCORES, SUMMED
from kvbench.cache.base import Cache
from kvbench.cache.contiguous import ConcatCache
from kvbench.config import DecoderConfig

POSITION = torch.long  # a retained key's absolute position: 8 bytes of metadata per layer and position


class EvictingCache(Cache):
    """Keys, values and absolute positions of the retained tokens of each layer, (B, KVH, T_kept, D) and (T_kept,)."""

    kind = "evicting"  # abstract: a subclass names its mode, whose spec says evicts=True
    evicts = True  # what register_kind's spec of a subclass says (kvbench.modes.spec_of_cache)
    per_head = False  # True: each key/value head keeps its own positions, (B, KVH, T_kept)

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None, history: bool = False,
                 device=None) -> None:
        super().__init__(config, batch, capacity, device)
        if self.wants_scores is not None and self.wants_scores not in SCORES:
            raise ValueError(f"wants_scores is None or one of {list(SCORES)}, got {self.wants_scores!r}")
        empty = torch.empty(batch, config.kv_heads, 0, config.head_dim, dtype=config.dtype, device=self.device)
        self._keys, self._values = [empty] * config.layers, [empty] * config.layers
        shape = (batch, config.kv_heads, 0) if self.per_head else (0,)
        self._positions = [torch.empty(shape, dtype=POSITION, device=self.device)] * config.layers
        self._totals: list[Tensor | None] = [None] * config.layers  # running attention per retained key and KV head
        self._stage: dict[int, dict] = {}  # layer -> the step's keys, values, positions (and scores)
        self.last_scores: list[Tensor | None] = [None] * config.layers
        self.history: list | None = [] if history else None

    # -- the policy -------------------------------------------------------------------------------

    def choose(self, layer: int, positions: Tensor, scores: Tensor | None) -> Tensor | None:
        """Absolute positions to drop from `layer` when the step commits, among `positions` (the retained ones
        and the step's new ones, oldest first); `scores` is their running total (B, KVH, S), None unless the kind
        wants scores. The base keeps everything."""
        return None

    def choose_per_head(self, layer: int, stage: dict) -> Tensor | None:
        """A per-head kind's answer: (B, KVH, n) indices into the staged entries (`stage["positions"]`, (B, KVH,
        S), oldest first; `stage["keys"]`, `stage["values"]`, and what observe() put there) that each head keeps
        when the step commits, the same count for every head; None keeps everything."""
        return None

    # -- the protocol -----------------------------------------------------------------------------

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        held = self._positions[layer]
        new = torch.arange(self.length, self.length + k.shape[-2], device=self.device)
        positions = torch.cat((held, new.expand(*held.shape[:-1], -1)), dim=-1)
        keys, values = torch.cat((self._keys[layer], k), dim=2), torch.cat((self._values[layer], v), dim=2)
        self._stage[layer] = {"keys": keys, "values": values, "positions": positions}
        # Until something is evicted the keys are 0..T-1 and attention keeps its fast paths; after, the mask
        # comes from the positions.
        self.key_positions = None if held.shape[-1] == self.length else positions
        return keys, values

    def observe(self, layer: int, scores: Tensor) -> None:
        stage = self._stage[layer]
        if self.wants_scores == QUERIES:  # the kind computes what it needs from the step's queries itself
            stage["scores"] = scores
            return
        S = stage["positions"].shape[-1]
        B, KVH = self.batch, self.config.kv_heads
        summed = scores if self.wants_scores == SUMMED else scores.view(B, KVH, -1, *scores.shape[-2:]).sum(dim=(2, 3))
        held = self._totals[layer]
        before = summed.new_zeros(B, KVH, S) if held is None else torch.cat(
            (held, held.new_zeros(B, KVH, S - held.shape[-1])), dim=-1)
        stage["totals"], stage["scores"] = before + summed, scores

    def commit(self, length: int) -> None:
        keeps = {layer: self._selection(layer, stage)
                 for layer, stage in self._stage.items()}  # every answer checked before anything changes
        if self.history is not None:
            self.history.append((torch.arange(self.length, self.length + length, device=self.device),
                                 {layer: stage["positions"] for layer, stage in self._stage.items()}))
        for layer, stage in self._stage.items():
            self._keys[layer], self._values[layer], self._positions[layer] = (
                stage["keys"], stage["values"], stage["positions"])
            self._totals[layer], self.last_scores[layer] = stage.get("totals"), stage.get("scores")
            self._apply(layer, keeps[layer])
        self._stage, self.key_positions = {}, None
        super().commit(length)

    def rollback(self) -> None:
        self._stage, self.key_positions = {}, None

    def evict(self, positions, layer: int | None = None) -> None:
        """Drop retained `positions` (absolute) from `layer`, or from every layer; ValueError, changing nothing,
        for a position not retained there, a repeated one, or a call during a step."""
        if self._stage:
            raise ValueError(f"evict between steps: expected no step in progress, got one staging layers "
                             f"{sorted(self._stage)}")
        layers = range(self.config.layers) if layer is None else [layer]
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)
                                  or not 0 <= layer < self.config.layers):
            raise ValueError(f"layer must be in [0, {self.config.layers - 1}], got {layer!r}")
        keeps = {one: self._kept(self._positions[one], positions, one) for one in layers}
        for one, keep in keeps.items():
            self._apply(one, keep)

    def _selection(self, layer: int, stage: dict) -> Tensor | None:
        if self.per_head:
            return self._checked_index(stage["positions"], self.choose_per_head(layer, stage), layer)
        return self._kept(stage["positions"], self.choose(layer, stage["positions"], stage.get("totals")), layer)

    def _checked_index(self, held: Tensor, index: Tensor | None, layer: int) -> Tensor | None:
        """A per-head answer as (B, KVH, n) indices, or ValueError naming what was expected."""
        if index is None:
            return None
        B, KVH, S = held.shape
        if not isinstance(index, Tensor) or index.dtype != torch.long or index.dim() != 3 or index.shape[:2] != (B, KVH):
            raise ValueError(f"layer {layer}: a per-head kind keeps (B={B}, KVH={KVH}, n) long indices, got "
                             f"{getattr(index, 'dtype', type(index).__name__)} {tuple(getattr(index, 'shape', ()))}")
        ordered = index.sort(dim=-1).values
        if len(ordered.flatten()) and (ordered[..., 0].min() < 0 or ordered[..., -1].max() >= S
                                       or (ordered.diff(dim=-1) == 0).any()):
            raise ValueError(f"layer {layer}: kept indices must be distinct and in [0, {S - 1}] for each head, got "
                             f"{index.flatten()[:8].tolist()}...")
        return ordered

    def _kept(self, held: Tensor, drop, layer: int) -> Tensor | None:
        """The keep mask over `held` once `drop` goes, or ValueError naming what is held and what was asked."""
        if drop is None:
            return None
        try:
            drop = torch.as_tensor(drop, device=self.device)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"positions to evict must be integers, got {drop!r}") from None
        if drop.is_floating_point() or drop.is_complex() or drop.dtype == torch.bool:
            raise ValueError(f"positions to evict must be integers, got dtype {drop.dtype}")
        drop = drop.reshape(-1).to(POSITION)
        heads = held.reshape(-1, held.shape[-1])  # per head (B * KVH rows), or the one row every head shares
        missing = drop[~(heads[:, None, :] == drop[None, :, None]).any(dim=-1).all(dim=0)]  # evicted from every head
        if len(missing) and held.dim() == 3:
            raise ValueError(f"layer {layer}: position {int(missing[0])} is not retained by every key/value head; "
                             f"expected positions all heads hold")
        if len(missing):
            raise ValueError(f"layer {layer} retains {len(held)} positions ({held[:8].tolist()}"
                             f"{'...' if len(held) > 8 else ''}); cannot evict position {int(missing[0])}, not among them")
        if drop.unique().numel() != drop.numel():
            raise ValueError(f"positions to evict must be distinct, got {drop.tolist()}")
        keep = ~torch.isin(held, drop)
        return keep if held.dim() == 1 else keep.nonzero()[:, -1].view(*held.shape[:-1], -1)  # per head: indices

    def _apply(self, layer: int, keep: Tensor | None) -> None:
        if keep is not None and keep.dim() == 3:  # per head: (B, KVH, n) indices of what each head keeps
            if keep.shape[-1] == self._positions[layer].shape[-1]:
                return
            rows = keep[..., None].expand(-1, -1, -1, self.config.head_dim)
            self._keys[layer] = self._keys[layer].gather(2, rows)
            self._values[layer] = self._values[layer].gather(2, rows)
            self._positions[layer] = self._positions[layer].gather(2, keep)
            if self._totals[layer] is not None:
                self._totals[layer] = self._totals[layer].gather(2, keep)
            return
        if keep is None or bool(keep.all()):
            return
        index = keep.nonzero().squeeze(1)
        self._keys[layer] = self._keys[layer].index_select(2, index)
        self._values[layer] = self._values[layer].index_select(2, index)
        self._positions[layer] = self._positions[layer].index_select(0, index)
        if self._totals[layer] is not None:
            self._totals[layer] = self._totals[layer].index_select(2, index)

    # -- what it holds ----------------------------------------------------------------------------

    def keys(self, layer: int = 0) -> Tensor:
        return self._keys[layer]

    def values(self, layer: int = 0) -> Tensor:
        return self._values[layer]

    def positions(self, layer: int = 0) -> Tensor:
        """Absolute positions of the retained keys, oldest first: (T_kept,), or (B, KVH, T_kept) per head."""
        return self._positions[layer]

    def scores(self, layer: int = 0) -> Tensor | None:
        """The running attention total of each retained key, (B, KVH, T_kept); None unless the kind wants scores."""
        return self._totals[layer]

    @property
    def nbytes(self) -> int:
        """Retained keys and values, and their positions (the metadata eviction needs), counted from the tensors."""
        return super().nbytes + sum(t.numel() * t.element_size() for t in self._positions)

    @property
    def reserved_bytes(self) -> int:
        return self.nbytes + sum(t.numel() * t.element_size() for t in self._totals if t is not None)


class MaskedCache(ConcatCache):
    """The full path masked row by row: a concat cache that hands attention, at each layer, the visibility
    `masks[layer]` (T, T) of one forward over every position (the batch's key_mask path)."""

    kind = "masked"

    def __init__(self, config: DecoderConfig, batch: int, masks: list[Tensor]) -> None:
        super().__init__(config, batch, device=masks[0].device if masks else None)
        self.masks = masks

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        mask = self.masks[layer]  # (T, T), or (B, KVH, T, T) where each key/value head kept its own positions
        self.key_mask = mask[None, None] if mask.dim() == 2 else mask  # read by the block after update, layer by layer
        return super().update(layer, k, v)


def kept_masks(history: list, layers: int, length: int, device=None) -> list[Tensor]:
    """(T, T) visibility per layer from an evicting cache's history (kvbench.cache.evicting), (B, KVH, T, T) for a
    per-head kind: the query at position p sees exactly the positions the step that computed p held (and the
    earlier ones of its chunk)."""
    lead = history[0][1][0].shape[:-1] if history and history[0][1] else ()
    masks = [torch.zeros(*lead, length, length, dtype=torch.bool, device=device) for _ in range(layers)]
    for new, seen in history:
        rows = new[new < length]
        for layer, positions in seen.items():
            if positions.dim() == 1:
                masks[layer][rows[:, None], positions[None, :]] = positions[None, :] <= rows[:, None]
                continue
            sees = positions[..., None, :] <= rows[:, None]  # (B, KVH, rows, S)
            where = positions[..., None, :].expand_as(sees)
            masks[layer][..., rows, :] = torch.zeros_like(masks[layer][..., rows, :]).scatter_(-1, where, sees)
    return masks


def masked_reference(model, ids: Tensor, history: list) -> Tensor:
    """(B, T, V) logits of the full path over ids masked to exactly the positions an evicting kind kept at each
    step: one forward, whatever the kind's rule, scores included. `model` is a kvbench.model.Decoder (a layer
    above: handed in, not imported)."""
    if model.config.window is not None:
        raise ValueError(f"an evicting kind is gated on a model without a window: expected window=None, got "
                         f"window={model.config.window}")
    B, T = ids.shape
    with torch.inference_mode():
        return model(ids, MaskedCache(model.config, B, kept_masks(history, model.config.layers, T, model.device)))[0]
