"""The paged kind: key/value blocks in a shared pool, addressed through a block table per request."""

from __future__ import annotations

import torch
from torch import Tensor

from kvbench.cache.base import Cache, ceil_div, expected_cache_bytes
from kvbench.config import DecoderConfig, positive_int


class BlockPool:
    """Key/value storage for `num_blocks` blocks of `block_size` positions, shared by requests.

    One tensor holds every layer's keys and values: (layers, 2, KVH, num_blocks, block_size, D),
    where index 0 of the second dimension is keys and 1 is values. A block's positions are
    contiguous within each head, so gathering a sequence's blocks in table order yields its
    positions in order. Blocks are handed out from a free list and carry reference counts:
    a block shared by forked requests returns to the free list when its last holder releases it.
    """

    def __init__(self, config: DecoderConfig, num_blocks: int, block_size: int = 16,
                 device: torch.device | str | None = None) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            positive_int(name, value)
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.empty(0, device="cpu" if device is None else device).device  # "cuda" as "cuda:0"
        shape = (config.layers, 2, config.kv_heads, num_blocks, block_size, config.head_dim)
        # Like the other kinds, the pool belongs to the mode it is made in: made under
        # torch.inference_mode() it is an inference tensor (cheap views in the decode step,
        # writable only in inference mode); made outside, it works in and out of it.
        self.storage = torch.zeros(shape, dtype=config.dtype, device=self.device)
        # Per layer, keys and values as (1, KVH, num_blocks * block_size, D), slot = block * bs + offset:
        # a run of consecutive slots is then already a (B=1, KVH, T, D) attention operand.
        self.slots = [
            (self.storage[layer, 0].view(1, config.kv_heads, -1, config.head_dim),
             self.storage[layer, 1].view(1, config.kv_heads, -1, config.head_dim))
            for layer in range(config.layers)
        ]
        self._refcounts = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low indices first

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: keys and values of block_size positions in every layer."""
        return self.storage[:, :, :, 0].numel() * self.storage.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool's storage, free blocks included."""
        return self.storage.numel() * self.storage.element_size()

    def refcount(self, block: int) -> int:
        return self._refcounts[block]

    def allocate(self, count: int) -> list[int]:
        """Take `count` free blocks, each with reference count 1."""
        if count > len(self._free):
            raise ValueError(f"block pool exhausted: {count} blocks needed, {len(self._free)} free of {self.num_blocks}")
        blocks = [self._free.pop() for _ in range(count)]
        for block in blocks:
            self._refcounts[block] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        """One more holder for each block."""
        for block in blocks:
            if self._refcounts[block] < 1:
                raise ValueError(f"cannot share block {block}: expected a held block, its reference count is 0")
        for block in blocks:
            self._refcounts[block] += 1

    def release(self, blocks: list[int]) -> None:
        """One holder fewer for each block; blocks nobody holds go back to the free list."""
        counts: dict[int, int] = {}
        for block in blocks:
            counts[block] = counts.get(block, 0) + 1
        for block, count in counts.items():
            if self._refcounts[block] < count:
                raise ValueError(
                    f"cannot release block {block} {count} time(s): its reference count is {self._refcounts[block]}"
                )
        for block in blocks:
            self._refcounts[block] -= 1
            if self._refcounts[block] == 0:
                self._free.append(block)

    def copy_block(self, source: int, target: int) -> None:
        """Copy one block's keys and values, every layer, in one tensor op."""
        self.storage[:, :, :, target] = self.storage[:, :, :, source]

    def __repr__(self) -> str:
        return f"BlockPool(num_blocks={self.num_blocks}, block_size={self.block_size}, free_blocks={self.free_blocks})"


class PagedCache(Cache):
    """Keys and values in blocks of a BlockPool, addressed through a block table per sequence.

    Row b of the block table lists the pool blocks holding sequence b's positions in order:
    position p lives in block ``table[b][p // block_size]`` at offset ``p % block_size``. Blocks
    are allocated in reserve(), after the model's checks and before any write; update() writes
    the new positions straight into their pool slots and reads every position back through the
    table. fork() shares every block with a new request; a shared, partly filled last block is
    copied before either side appends to it (copy-on-write). Full blocks are never written
    again, so they stay shared.

    Reading through the table: when a single sequence's blocks are consecutive in the pool
    (a fresh request in a pool it has to itself), its keys are a view of the pool, with no
    copy; otherwise (forks, batches, a fragmented pool) they are gathered with one
    index_select per tensor, which copies the prefix as concat's torch.cat does.
    """

    kind = "paged"

    def __init__(
        self,
        config: DecoderConfig,
        batch: int = 1,
        capacity: int | None = None,
        block_size: int | None = None,
        pool: BlockPool | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        # A cache in a given pool lives where the pool does; asked for another device, it is refused below.
        super().__init__(config, batch, capacity, pool.device if pool is not None and device is None else device)
        if pool is None:
            size = positive_int("block_size", 16 if block_size is None else block_size)
            pool = BlockPool(config, batch * ceil_div(self.capacity, size), size, self.device)
        elif pool.device != self.device:
            raise ValueError(f"pool device mismatch: cache needs device {self.device}, pool is on device {pool.device}")
        elif block_size is not None and block_size != pool.block_size:
            raise ValueError(f"block_size mismatch: pool has block_size {pool.block_size}, got block_size={block_size}")
        for name in ("layers", "kv_heads", "head_dim", "dtype"):
            expected, actual = getattr(config, name), getattr(pool.config, name)
            if expected != actual:
                raise ValueError(f"pool {name} mismatch: cache needs {name}={expected}, pool has {name}={actual}")
        self.pool = pool
        self.block_size = pool.block_size
        self.released = False
        self._rows: list[list[int]] = [[] for _ in range(batch)]  # the block table, one row per sequence
        self._held = 0  # blocks per row; every row holds the same number
        self._tail_shared = False  # set by fork(): the partly filled last block may be shared
        self._first_block: int | None = None  # set while one sequence's blocks are consecutive
        self._slots: Tensor | None = None  # pool slots of the positions being appended
        self._undo: list | None = None  # how to give back what the last reserve took, until commit

    # -- protocol -------------------------------------------------------------------------

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        self._check_live()
        super().check_append(config, batch, length)
        if self.length + length > self._held * self.block_size or self._tail_shared:
            self._check_free_blocks(length)

    def commit(self, length: int) -> None:
        self._undo = None
        super().commit(length)

    def rollback(self) -> None:
        """Undo the last reserve: hand back the blocks it took, re-share the blocks it copied."""
        undo, self._undo = self._undo, None
        if not undo:
            return
        for row, where, shared, taken in reversed(undo[1:]):
            if shared is None:  # blocks appended to the row
                del row[where]
                self.pool.release(taken)
            else:  # a copy-on-write: the row gets its shared block back
                row[where] = shared
                self.pool.share([shared])
                self.pool.release([taken])
        self._held, self._tail_shared, self._first_block = undo[0]

    def reserve(self, length: int) -> None:
        """Copy a shared partial last block, allocate the blocks `length` more positions need."""
        start = self.length
        if start + length > self._held * self.block_size or self._tail_shared:
            self._reserve_blocks(length)
        self._slots = None  # the appended positions' pool slots, computed by the first update() that needs them
        super().reserve(length)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, new = self.length, k.shape[-2]
        keys, values = self.pool.slots[layer]  # (1, KVH, NB * bs, D)
        if self._first_block is not None and new == 1:  # the decode step: one slot, no index tensor
            slot = self._first_block * self.block_size + start
            keys.narrow(2, slot, 1).copy_(k)
            values.narrow(2, slot, 1).copy_(v)
        else:
            if self._slots is None:  # once per call, for every layer: a batch of one pool never asks (cache.batch)
                self._slots = self._slot_indices(start, start + new)  # (B * L,) row-major
            flat = (k.shape[1], -1, k.shape[-1])  # (KVH, B * L, D), row-major like the slots
            keys[0].index_copy_(1, self._slots, k.transpose(0, 1).reshape(flat))
            values[0].index_copy_(1, self._slots, v.transpose(0, 1).reshape(flat))
        return self._read(keys, start + new), self._read(values, start + new)

    # -- requests -------------------------------------------------------------------------

    def fork(self) -> PagedCache:
        """A new request in the same pool sharing all of this one's valid blocks, at the same length."""
        self._check_live()
        child = PagedCache(self.config, self.batch, self.capacity, pool=self.pool)
        used = ceil_div(self.length, self.block_size)
        child._rows = [row[:used] for row in self._rows]
        for row in child._rows:
            self.pool.share(row)
        child._held = used
        child.length = self.length
        child._first_block = self._first_block
        if self.length % self.block_size:
            self._tail_shared = child._tail_shared = True
        return child

    def adopt(self, blocks: list[int]) -> None:
        """Start this empty single-sequence cache with full blocks the pool already holds, their references already
        taken (a prefix cache's hit, kvbench.cache.prefix): positions 0..len(blocks) * block_size - 1 are theirs, at
        the same absolute positions they were computed at, and the next position starts a block of its own."""
        self._check_live()
        if self.batch != 1 or self.length or self._held:
            raise ValueError(f"adopt starts an empty cache of batch 1, got batch {self.batch} at length {self.length}")
        if len(blocks) * self.block_size > self.capacity:
            raise ValueError(f"adopting {len(blocks)} blocks of {self.block_size} positions exceeds capacity "
                             f"{self.capacity}")
        self._rows[0] = list(blocks)
        self._held, self.length = len(blocks), len(blocks) * self.block_size
        consecutive = bool(blocks) and list(blocks) == list(range(blocks[0], blocks[0] + len(blocks)))
        self._first_block = blocks[0] if consecutive else None

    def release(self) -> None:
        """Give every block back (shared blocks stay with their other holders); the cache is then unusable."""
        self._check_live()
        self.pool.release([block for row in self._rows for block in row])
        self._rows = [[] for _ in range(self.batch)]
        self._held = self.length = 0
        self._first_block = self._slots = None
        self.released = True

    # -- reading --------------------------------------------------------------------------

    def keys(self, layer: int = 0) -> Tensor:
        """Valid keys of one layer, (B, KVH, T, D), read from the pool through the block table."""
        self._check_live()
        return self._read(self.pool.slots[layer][0], self.length)

    def values(self, layer: int = 0) -> Tensor:
        self._check_live()
        return self._read(self.pool.slots[layer][1], self.length)

    @property
    def block_table(self) -> Tensor:
        """(B, blocks held per sequence) pool block indices, a copy."""
        return torch.tensor(self._rows, dtype=torch.long, device=self.device).view(self.batch, self._held)

    @property
    def nbytes(self) -> int:
        """Key/value bytes at valid positions, by arithmetic (counting gathered tensors would copy)."""
        return expected_cache_bytes(self.config, self.batch, self.length)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the pool blocks this request holds (shared blocks count for every holder)."""
        return self.batch * self._held * self.pool.block_bytes

    @property
    def fragmentation_bytes(self) -> int:
        """Held but unused bytes: the unfilled tail of each sequence's last block."""
        return self.reserved_bytes - self.nbytes

    @property
    def fragmentation(self) -> float:
        """fragmentation_bytes / reserved_bytes (0.0 when nothing is held)."""
        reserved = self.reserved_bytes
        return self.fragmentation_bytes / reserved if reserved else 0.0

    def __repr__(self) -> str:
        return (
            f"PagedCache(batch={self.batch}, length={self.length}, capacity={self.capacity}, "
            f"block_size={self.block_size}, blocks_held={self.batch * self._held}, released={self.released})"
        )

    # -- internals ------------------------------------------------------------------------

    def _check_live(self) -> None:
        if self.released:
            raise ValueError("cache was released: expected a live cache, got one whose blocks were returned to the pool")

    def _read(self, slots: Tensor, end: int) -> Tensor:
        """Positions 0..end-1 of one layer's (1, KVH, NB * bs, D) pool slots as (B, KVH, end, D), via the table."""
        if self._first_block is not None:  # consecutive blocks: a view of the pool
            return slots.narrow(2, self._first_block * self.block_size, end)
        gathered = slots[0].index_select(1, self._slot_indices(0, end))  # (KVH, B * end, D)
        return gathered.view(slots.shape[1], self.batch, end, slots.shape[-1]).transpose(0, 1)

    @property
    def table_row(self) -> list[int]:
        """The blocks of a single sequence, in position order (the list itself: a batch reads it, never edits it)."""
        if self.batch != 1:
            raise ValueError(f"table_row reads one sequence's blocks, got a cache of batch {self.batch}")
        return self._rows[0]

    def _slot_indices(self, start: int, end: int) -> Tensor:
        """Pool slots (block * block_size + offset) of positions start..end-1 of every row, row-major."""
        positions = torch.arange(start, end, device=self.device)
        table = torch.tensor(self._rows, dtype=torch.long, device=self.device).view(self.batch, -1)
        blocks = table[:, positions // self.block_size]
        return (blocks * self.block_size + positions % self.block_size).view(-1)

    def blocks_needed(self, length: int) -> int:
        """Free blocks appending `length` positions would take (a scheduler asks before it runs the step)."""
        return self._blocks_needed(length)

    def _blocks_needed(self, length: int) -> int:
        """Fresh blocks reserve(length) takes: new blocks per row plus copies of shared last blocks."""
        size, start = self.block_size, self.length
        needed = max(0, ceil_div(start + length, size) - self._held) * self.batch
        if start % size and self._tail_shared:
            index = start // size
            needed += sum(self.pool.refcount(row[index]) > 1 for row in self._rows)
        return needed

    def _check_free_blocks(self, length: int) -> None:
        needed, free = self._blocks_needed(length), self.pool.free_blocks
        if needed > free:
            raise ValueError(
                f"block pool exhausted: appending {length} positions to {self.batch} sequence(s) at length "
                f"{self.length} needs {needed} free blocks of {self.block_size} positions, "
                f"pool has {free} free of {self.pool.num_blocks}"
            )

    def _reserve_blocks(self, length: int) -> None:
        """Take blocks for `length` more positions, logging how to give them back (see rollback)."""
        pool, size, start = self.pool, self.block_size, self.length
        self._check_free_blocks(length)
        undo = self._undo = [(self._held, self._tail_shared, self._first_block)]
        if start % size and self._tail_shared:  # the next position falls in a shared block: copy it
            index = start // size
            for row in self._rows:
                if pool.refcount(row[index]) > 1:
                    shared, (fresh,) = row[index], pool.allocate(1)
                    undo.append((row, index, shared, fresh))
                    pool.copy_block(shared, fresh)
                    pool.release([shared])
                    row[index] = fresh
        if (start + length) // size > start // size:  # the shared block is full: later appends start their own
            self._tail_shared = False  # (one found unshared may be shared again when a fork's failed call rolls back)
        missing = ceil_div(start + length, size) - self._held
        if missing > 0:
            for row in self._rows:
                blocks = pool.allocate(missing)
                undo.append((row, slice(len(row), None), None, blocks))
                row.extend(blocks)
            self._held += missing
        row = self._rows[0]
        consecutive = self.batch == 1 and row == list(range(row[0], row[0] + len(row))) if row else False
        self._first_block = row[0] if consecutive else None
