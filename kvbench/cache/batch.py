"""Many requests in one model call: each row is a request with its own cache, at its own length.

Iteration-level scheduling (Orca, vLLM) runs one forward over every running request, whose
caches hold different numbers of positions and take different numbers of new tokens (a
prefill chunk, or one decode token). `BatchedCache` drives every row's own cache through the
protocol of kvbench.cache.base, and gives the model what a ragged batch needs:

- `row_positions` (B, L): the absolute position of each new token in its own request, so rotary
  tables and learned positions are read per row (a padded query repeats its row's last position);
- `key_mask` (B, 1, L, S): a query sees its own request's keys up to its position, never another
  row's padding, so every row's logits are those of its request alone. A row whose cache evicted (its keys
  carry their absolute positions, kvbench.cache.evicting) is masked by those positions, layer by layer; when
  one keeps its own positions per key/value head (kvbench.cache.scored) the mask is (B, KVH, L, S);
- attention scores for the rows that score their positions: the batch asks the model for the step's queries
  (the cheapest summary: nothing is computed) and hands each such row its own, or the weights its own queries
  give its own keys (kvbench.attention.attention_scores, as the row's call alone would compute them).

Rows are padded to the longest: new tokens to L = max new, keys to S = max held. The padded
queries' outputs are thrown away and their keys are never written to any cache.

Every layer's keys and values are copied into one padded (B, KVH, S, D) operand. Fresh, that operand is fresh
memory, and on this CPU (a VM) first touching fresh pages costs more than the copy: the padded gather of 16
rows of a few hundred positions each took about 8 ms a layer, 4x its copy's time, and made an extra row cost
several times its matmuls (scripts/row_cost.py, docs/serving.md). So the operands are written into a
`Workspace`, scratch tensors kept from layer to layer and call to call (a server's scheduler holds one for
its whole run): each layer's keys are dead once its attention has read them, and the next layer overwrites
them. A padded position is masked; what it holds is stale but finite (zeros, or keys of an earlier call).
"""

from __future__ import annotations

from array import array

import torch
from torch import Tensor

from kvbench.attention import QUERIES, attention_scores
from kvbench.cache.base import Cache
from kvbench.cache.paged import PagedCache
from kvbench.config import DecoderConfig


class Workspace:
    """Scratch tensors by name, grown when a call needs more and otherwise reused: the keys and values a
    batched call gathers live only until its attention reads them, so one buffer of each serves every layer
    and every call. Made zero, so a padded position never holds anything but finite stale values."""

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def take(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A contiguous tensor of `shape` with `like`'s dtype and device, whose contents are stale."""
        count = 1
        for size in shape:
            count *= size
        held = self._buffers.get(name)
        if held is None or held.numel() < count or held.dtype != like.dtype or held.device != like.device:
            # a quarter more than asked: rows grow by a token a step and must not make a new buffer each step
            held = torch.zeros(count + count // 4, dtype=like.dtype, device=like.device)
            self._buffers[name] = held
        return held[:count].view(shape)

    @property
    def nbytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers.values())


class BatchedCache(Cache):
    """A view of `rows` (one cache per request) for one call of the model on ids (B, max(new)). `workspace`:
    where the padded keys and values are gathered (a fresh one for this call when None)."""

    kind = "batched"

    def __init__(self, rows: list[Cache], new: list[int], workspace: Workspace | None = None) -> None:
        if not rows or len(rows) != len(new):
            raise ValueError(f"expected one new-token count per row cache, got {len(rows)} caches and {len(new)} counts")
        if any(isinstance(count, bool) or not isinstance(count, int) or count < 1 for count in new):
            raise ValueError(f"every row takes at least one new token, got {new}")
        if any(row.batch != 1 or row.key_positions is not None for row in rows):
            raise ValueError("every row must be one sequence whose keys are its positions 0..T-1 (no window ring)")
        devices = {row.device for row in rows}
        if len(devices) != 1:
            raise ValueError(f"every row's cache must be on one device, got devices {sorted(map(str, devices))}")
        super().__init__(rows[0].config, batch=len(rows), device=rows[0].device)
        self.rows, self.new = rows, new
        self.workspace = Workspace() if workspace is None else workspace
        self.slots: tuple[Tensor, Tensor, Tensor] | None = None  # set by reserve() when every row is in one pool
        width, device = max(new), self.device
        starts = torch.tensor([row.length for row in rows], device=device)[:, None]  # (B, 1)
        steps = torch.minimum(torch.arange(width, device=device)[None, :],
                              torch.tensor(new, device=device)[:, None] - 1)  # (B, L): padding repeats
        self.row_positions = starts + steps  # (B, L)
        self.appended = self.row_positions  # (B, L) where each new token is stored: the positions the model reads
        # The keys' count from the Python ints, not row_positions.max(): reading a device tensor would wait for it.
        keys = torch.arange(max(row.length + count for row, count in zip(rows, new)), device=device)
        self.key_mask = (keys[None, None, :] <= self.row_positions[:, :, None])[:, None]  # (B, 1, L, S)
        self.key_lengths = tuple(row.length + count for row, count in zip(rows, new))  # None once a row evicts
        self.base_mask = self.key_mask  # every row's keys at 0..T-1: what a row that evicted nothing at a layer sees
        self._own_mask = False  # whether key_mask is this batch's copy, rewritten row by row for evicting rows
        self._masked: set[int] = set()  # rows whose mask the last layer rewrote from their kept positions
        # Queries: the model computes nothing for them, and each row's own summary is computed from its own slice.
        self.wants_scores = QUERIES if any(row.wants_scores is not None for row in rows) else None
        self._scoring_keys: dict[int, Tensor] = {}  # row -> the keys its update returned at this layer

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        if batch != len(self.rows) or length != max(self.new):
            raise ValueError(f"batched call mismatch: expected ids ({len(self.rows)}, {max(self.new)}), "
                             f"got ({batch}, {length})")
        for row, count in zip(self.rows, self.new):
            row.check_append(config, 1, count)

    def reserve(self, length: int) -> None:
        done = []
        try:
            for row, count in zip(self.rows, self.new):
                row.reserve(count)
                done.append(row)
        except BaseException:
            for row in done:
                row.rollback()
            raise
        pools = {id(row.pool) for row in self.rows if isinstance(row, PagedCache)}
        self.slots = self._pool_slots() if len(pools) == 1 and all(isinstance(r, PagedCache) for r in self.rows) else None

    def _pool_slots(self) -> tuple[Tensor, Tensor, Tensor]:
        """Rows of one pool, addressed all at once: (the new tokens' index in k flattened row-major over (B, L),
        their pool slots, every row's blocks (B * blocks of the longest row; a padded block reads block 0 and
        is masked)). Reading whole blocks, as a paged-attention kernel walks its block table, copies blocks of
        block_size positions rather than gathering position by position (about 4x faster on this CPU). The
        tables are padded in Python lists and made one tensor; positions and slots are tensor ops over the
        whole batch, so a decode iteration pays a few tensor calls, not a few per row."""
        width, size = max(self.new), self.rows[0].block_size
        blocks = -(-self.key_mask.shape[-1] // size)  # of the longest row
        padded = array("q")  # C longs: torch reads them at once, where a nested list is read element by element
        for row in self.rows:
            owned = row.table_row[:blocks]
            padded.extend(owned)
            padded.extend([0] * (blocks - len(owned)))
        # frombuffer reads host memory only; .to() is free on the CPU
        table = torch.frombuffer(padded, dtype=torch.long).to(self.device).view(len(self.rows), blocks)  # (B, blocks)
        positions = self.appended  # (B, L): padded queries repeat their row's last position
        slots = table.gather(1, positions // size) * size + positions % size  # (B, L)
        if all(count == width for count in self.new):  # every row takes L tokens (a decode step): no padding
            return torch.arange(len(self.rows) * width, device=self.device), slots.view(-1), table.view(-1)
        # The unpadded queries' flat indices from the Python counts: nonzero() on a device tensor would wait for it.
        picked = torch.tensor([b * width + i for b, count in enumerate(self.new) for i in range(count)],
                              dtype=torch.long, device=self.device)
        return picked, slots.view(-1).index_select(0, picked), table.view(-1)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (B, KVH, L, D) -> every row's keys and values (B, KVH, S, D), zero past each row's own."""
        B, KVH, _, D = k.shape
        if self.slots is not None:  # one pool: one write and one gather for every row, as paged attention reads
            return tuple(self._through_pool(layer, index, new) for index, new in enumerate((k, v)))
        S = self.key_mask.shape[-1]
        keys, values = (self.workspace.take(name, (B, KVH, S, D), k) for name in ("keys", "values"))
        for b, (row, count) in enumerate(zip(self.rows, self.new)):
            row_keys, row_values = row.update(layer, k[b : b + 1, :, :count], v[b : b + 1, :, :count])  # (1, KVH, T, D)
            keys[b, :, : row_keys.shape[-2]] = row_keys[0]
            values[b, :, : row_values.shape[-2]] = row_values[0]
            if row.key_positions is not None:  # an evicting row: its keys are visible by their positions, not slots
                self._mask_row(b, row.key_positions)
            elif b in self._masked:  # it evicted at the last layer, not at this one: its keys are 0..T-1 here
                self.key_mask[b] = self.base_mask[b]
                self._masked.discard(b)
            if row.wants_scores is not None:
                self._scoring_keys[b] = row_keys
        return keys, values

    def _mask_row(self, b: int, held: Tensor) -> None:
        """Row b's visibility from the absolute positions of the keys its cache returned (this layer's): (T,), or
        (1, KVH, T) where each key/value head kept its own, which makes the batch's mask (B, KVH, L, S)."""
        visible = held[..., None, :] <= self.row_positions[b][:, None]  # (L, T) or (1, KVH, L, T)
        self.key_lengths = None  # its keys are no longer its positions in order: the mask says what each sees
        heads = self.config.kv_heads if held.dim() == 3 else self.key_mask.shape[1]
        if not self._own_mask or heads != self.key_mask.shape[1]:
            B, _, L, S = self.key_mask.shape
            self.key_mask, self._own_mask = self.key_mask.expand(B, heads, L, S).clone(), True
        self.key_mask[b] = False
        self.key_mask[b, :, :, : held.shape[-1]] = visible[0] if held.dim() == 3 else visible
        self._masked.add(b)

    def observe(self, layer: int, scores: Tensor) -> None:
        """scores: the step's queries (B, H, L, D). Each row that scores gets its own rows of them, or what its own
        call would have computed from them and its own keys (its positions, no padding)."""
        for b, (row, count) in enumerate(zip(self.rows, self.new)):
            if row.wants_scores is None:
                continue
            mine = scores[b : b + 1, :, :count]
            row.observe(layer, mine if row.wants_scores == QUERIES else attention_scores(
                mine, self._scoring_keys.pop(b), row.length, key_positions=row.key_positions, summary=row.wants_scores))

    def _through_pool(self, layer: int, index: int, new: Tensor) -> Tensor:
        picked, written, read = self.slots
        blocks = self.rows[0].pool.storage[layer, index]  # (KVH, NB, bs, D)
        KVH, _, size, D = blocks.shape
        blocks.view(KVH, -1, D).index_copy_(1, written, new.transpose(0, 1).reshape(KVH, -1, D).index_select(1, picked))
        B, S = len(self.rows), self.key_mask.shape[-1]
        gathered = self.workspace.take(("keys", "values")[index], (KVH, len(read), size, D), blocks)
        torch.index_select(blocks, 1, read, out=gathered)
        gathered = gathered.view(KVH, B, -1, D)  # (KVH, B, blocks * bs, D)
        return gathered.transpose(0, 1).narrow(2, 0, S)  # (B, KVH, S, D)

    def commit(self, length: int) -> None:
        for row, count in zip(self.rows, self.new):
            row.commit(count)

    def rollback(self) -> None:
        for row in self.rows:
            row.rollback()

    @property
    def nbytes(self) -> int:
        return sum(row.nbytes for row in self.rows)

    @property
    def reserved_bytes(self) -> int:
        return sum(row.reserved_bytes for row in self.rows)
