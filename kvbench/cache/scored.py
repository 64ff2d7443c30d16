"""Score-based eviction: after the prompt, each key/value head keeps its top-k positions by a kind's score.

The kinds of kvbench.cache.scoring (knorm, snapkv, tova, h2o, pyramidkv, streamingllm, random) are NVIDIA kvpress's
"presses" on kvbench's evicting seam (kvbench.cache.evicting). Each writes `score(layer, held)`: one number per
retained position and key/value head, (B, KVH, S), higher kept. This class does the rest, as kvpress does it and
where kvpress stops:

- When. The prompt (every step of more than one token, chunks included) is kept whole; the first one-token step
  after it compresses the cache before it attends, so the first new token sees exactly what kvpress's press
  leaves after its prefill. With `evict_every=N`, every N-th one-token step after that evicts again, back to the
  budget (kvpress compresses only after prefill). `compress()` does it between steps, for timing it alone.
- How much. `evict_ratio=r` keeps kvpress's `max(1, int(T * (1 - r)))` of the T positions appended so far, the
  same count in every head; `kv_keep=N` keeps N. Nothing is evicted while a head holds no more than its budget.
- What. `torch.topk` of the scores, as kvpress: equal scores fall to its order. The kept positions are stored
  oldest first with their absolute positions (kvbench.attention builds each head's mask from them), and the
  evicted keys and values are gone from the tensors: `nbytes` is what is kept.
- Scores from attention need the queries: a kind that wants them (`wants_scores = "queries"`) is handed each
  step's rotated queries, and this class keeps the newest `observation` of them per layer (SnapKV's window, TOVA's
  last query) for the next compression.
- For a server. Made with `prompt=P` (a request whose prompt length is known: kvbench.serving's admission), the
  steps before position P are its prompt, in chunks of any size, one token included, and every later step is one
  token (another is refused); `reserved_bytes` is then the most it will hold from now on
  (kvbench.kinds.scored_held_bytes): its uncompressed prompt until the first decoding step compresses it, then
  its budget and the steps since. Without `prompt`, it is what its tensors hold (`allocated_bytes`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kvbench.attention import QUERIES, SUMMED, WEIGHTS, visibility
from kvbench.cache.evicting import EvictingCache
from kvbench.config import DecoderConfig
from kvbench.kinds import DEFAULT_EVICT_RATIO, keep_budget, scored_held_bytes


def check_eviction_options(kind: str, evict_ratio, kv_keep, evict_every, protected: int = 0) -> None:
    """ValueError, naming expected and actual, for options no scored kind can honour."""
    if evict_ratio is not None and kv_keep is not None:
        raise ValueError(f"{kind}: give evict_ratio or kv_keep, not both; got evict_ratio={evict_ratio!r} and "
                         f"kv_keep={kv_keep!r}")
    if evict_ratio is not None and (isinstance(evict_ratio, bool) or not isinstance(evict_ratio, (int, float))
                                    or not math.isfinite(evict_ratio) or not 0 <= evict_ratio < 1):
        raise ValueError(f"{kind}: evict_ratio is the fraction of positions removed, in [0, 1), got {evict_ratio!r}")
    if kv_keep is not None and (isinstance(kv_keep, bool) or not isinstance(kv_keep, int) or kv_keep < max(1, protected)):
        raise ValueError(f"{kind}: kv_keep is the positions each head keeps, an integer of at least "
                         f"{max(1, protected)} (what {kind} always keeps), got {kv_keep!r}")
    if evict_every is not None and (isinstance(evict_every, bool) or not isinstance(evict_every, int) or evict_every < 1):
        raise ValueError(f"{kind}: evict_every is a number of decoding steps, at least 1, got {evict_every!r}")


class ScoredCache(EvictingCache):
    """Each key/value head keeps the top-k of its positions by `score`, after the prompt and every `evict_every`
    decoding steps."""

    kind = "scored"  # abstract: kvbench.cache.scoring holds the kinds
    per_head = True
    wants_scores = QUERIES  # a kind scoring from keys alone (knorm, random, streamingllm) sets None
    observation = 1  # the newest queries kept per layer for the next compression
    protected = 0  # the newest positions a compression always keeps (SnapKV's window): kv_keep's lower bound
    pyramid = False  # each layer its own budget (kvbench.kinds.pyramid_budget), which the reservation follows

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None, history: bool = False,
                 device=None, evict_ratio: float | None = None, kv_keep: int | None = None,
                 evict_every: int | None = None, prompt: int | None = None) -> None:
        self.check_options(evict_ratio, kv_keep, evict_every)
        if config.window is not None:
            raise ValueError(f"{self.kind} evicts by its own scores: expected a model without a sliding window, got "
                             f"window={config.window}")
        super().__init__(config, batch, capacity, history, device)
        if prompt is not None and (isinstance(prompt, bool) or not isinstance(prompt, int)
                                   or not 1 <= prompt <= self.capacity):
            raise ValueError(f"{self.kind}: prompt is the request's prompt length, in [1, capacity {self.capacity}], "
                             f"got {prompt!r}")
        self.prompt = prompt
        self.evict_ratio = DEFAULT_EVICT_RATIO if evict_ratio is None and kv_keep is None else evict_ratio
        self.kv_keep, self.evict_every = kv_keep, evict_every
        self.compressions = 0  # compressions that evicted something
        self.decode_steps = 0  # one-token steps since the prompt
        self._queries: list[Tensor | None] = [None] * config.layers  # (B, H, w, D), newest last
        self._query_positions: list[Tensor | None] = [None] * config.layers  # (w,)
        self._due = False
        self._undo: dict[int, tuple] = {}  # layer -> its committed state, while a step that evicted is staged
        self._plan = None if prompt is None else self._reservations(self.capacity, prompt)

    def _reservations(self, capacity: int, prompt: int) -> list[int]:
        """[t]: the most it holds from t decoding steps on (the prompt's peak included at 0)."""
        state = self.state_kept()
        held = scored_held_bytes(self.config, capacity, prompt, self.pyramid, state["observation"], state["totals"],
                                 self.evict_ratio, self.kv_keep, self.evict_every)
        for t in range(len(held) - 2, -1, -1):
            held[t] = max(held[t], held[t + 1])
        return held

    @classmethod
    def state_kept(cls) -> dict:
        """What it keeps to score with beside its positions (kvbench.kinds.scored_held_bytes' arguments): the
        newest queries, and a running score per position."""
        return {"observation": cls.observation if cls.wants_scores == QUERIES else 0,
                "totals": cls.wants_scores in (SUMMED, WEIGHTS)}

    @classmethod
    def check_options(cls, evict_ratio=None, kv_keep=None, evict_every=None) -> None:
        """ValueError for options this kind cannot honour (a keep count below what it always keeps)."""
        check_eviction_options(cls.kind, evict_ratio, kv_keep, evict_every, cls.protected)

    # -- what a kind writes -----------------------------------------------------------------------

    def score(self, layer: int, held: dict) -> Tensor:
        """(B, KVH, S) scores of the retained positions; `held` has "keys", "values", "positions" (B, KVH, S),
        "queries" (B, H, w, D) and "query_positions" (w,) when the kind wants queries, "totals" when it keeps them."""
        raise NotImplementedError

    def budget(self, layer: int, length: int) -> int:
        """Positions each head of `layer` keeps once `length` positions were appended."""
        return keep_budget(length, self.evict_ratio, self.kv_keep)

    # -- when and what ------------------------------------------------------------------------------

    def held(self, layer: int) -> dict:
        return {"keys": self._keys[layer], "values": self._values[layer], "positions": self._positions[layer],
                "queries": self._queries[layer], "query_positions": self._query_positions[layer],
                "totals": self._totals[layer]}

    def keep_index(self, layer: int) -> Tensor | None:
        """(B, KVH, n) indices of the retained entries each head keeps now, oldest first; None: within budget."""
        held = self._positions[layer]
        n = self.budget(layer, self.length)
        if held.shape[-1] <= n:
            return None
        return self.score(layer, self.held(layer)).topk(n, dim=-1).indices.sort(dim=-1).values

    def compress(self) -> int:
        """Evict every layer back to its budget now, between steps; the positions evicted in all."""
        if self._stage:
            raise ValueError(f"compress between steps: expected no step in progress, got one staging layers "
                             f"{sorted(self._stage)}")
        before = self.retained()
        for layer in range(self.config.layers):
            self._apply(layer, self._checked_index(self._positions[layer], self.keep_index(layer), layer))
        evicted = before - self.retained()
        self.compressions += evicted > 0
        return evicted

    def retained(self) -> int:
        """Positions held, summed over layers and heads."""
        return sum(positions.numel() for positions in self._positions)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if not self._stage:  # the step's first layer decides for all of them
            self._due = self._compression_due(k.shape[-2])
        if self._due:  # before the step attends: its queries see only what is kept
            index = self._checked_index(self._positions[layer], self.keep_index(layer), layer)
            if index is not None:
                # The layer's state as committed, for rollback: _apply builds new tensors, so references suffice.
                self._undo[layer] = (self._keys[layer], self._values[layer], self._positions[layer], self._totals[layer])
                self._apply(layer, index)
        return super().update(layer, k, v)

    def _decoding(self, start: int, new: int) -> bool:
        """Whether a step of `new` tokens from `start` decodes: one token after the prompt (any step of more is a
        chunk of it, kept whole), or after `prompt` positions when the request's prompt is known."""
        return new == 1 and start > 0 if self.prompt is None else start >= self.prompt

    def _compression_due(self, new: int) -> bool:
        if not self._decoding(self.length, new):
            return False
        return self.decode_steps == 0 or (self.evict_every is not None and self.decode_steps % self.evict_every == 0)

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        super().check_append(config, batch, length)
        if self.prompt is None:
            return
        if self.length < self.prompt < self.length + length:
            raise ValueError(f"{self.kind}: a prompt chunk ends at the prompt's end, position {self.prompt}: expected at "
                             f"most {self.prompt - self.length} tokens from position {self.length}, got {length}")
        if self.length >= self.prompt and length != 1:
            raise ValueError(f"{self.kind}: after its prompt of {self.prompt} a request decodes one token a step, "
                             f"got {length}")

    def rollback(self) -> None:
        for layer, (keys, values, positions, totals) in self._undo.items():
            self._keys[layer], self._values[layer], self._positions[layer], self._totals[layer] = keys, values, positions, totals
        self._undo = {}
        super().rollback()

    def commit(self, length: int) -> None:
        queries = {layer: stage.get("scores") for layer, stage in self._stage.items()}
        start = self.length
        super().commit(length)
        self.last_scores = [None] * self.config.layers  # its own window of queries is all it keeps of them
        if self._decoding(start, length):
            self.decode_steps += 1
        self.compressions += bool(self._undo)
        self._undo = {}
        if self.wants_scores != QUERIES:
            return
        new = torch.arange(start, start + length, device=self.device)
        w = self.observation
        for layer, q in queries.items():
            if q is None:
                continue
            previous, recent = self._queries[layer], q[:, :, -w:]
            # A copy of the newest w alone: a view would keep a whole prompt chunk's (or a batch's) queries alive.
            older = 0 if previous is None else min(w - recent.shape[2], previous.shape[2])
            self._queries[layer] = recent.clone() if not older else torch.cat(
                (previous.narrow(2, previous.shape[2] - older, older), recent), dim=2)
            positions = new if previous is None else torch.cat((self._query_positions[layer], new))
            self._query_positions[layer] = positions[-w:]

    @property
    def allocated_bytes(self) -> int:
        """What its tensors hold now: the positions it keeps, and the queries and running scores it scores with."""
        return super().reserved_bytes + sum(q.numel() * q.element_size() for q in self._queries if q is not None)

    @property
    def reserved_bytes(self) -> int:
        """With `prompt`, the most it holds from now on (its plan never falls below what it holds); without, what
        it holds."""
        if self._plan is None:
            return self.allocated_bytes
        return self._plan[min(self.decode_steps, len(self._plan) - 1)]


def window_weights(held: dict, heads: int) -> Tensor:
    """Softmax weights (B, H, w, S) the kept queries give the retained keys, each head its own mask, in float32
    (as kvpress's compute_window_attention): a query sees a key at or before its position."""
    keys, queries, positions = held["keys"], held["queries"], held["positions"]
    B, KVH, S, D = keys.shape
    w = queries.shape[2]
    logits = torch.einsum("bkgwd,bksd->bkgws", queries.reshape(B, KVH, heads // KVH, w, D), keys) / math.sqrt(D)
    seen = visibility(held["query_positions"], positions, None)[:, :, None]  # (B, KVH, 1, w, S)
    return logits.masked_fill(~seen, float("-inf")).softmax(dim=-1, dtype=torch.float32).reshape(B, heads, w, S)
