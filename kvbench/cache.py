"""Key/value caches: one request's retained keys and values, held by the caller.

Every kind implements the same small protocol, which ``Decoder.forward`` drives:

    cache.check_append(config, batch, length)  # validate; raises ValueError, mutates nothing
    cache.reserve(length)                      # claim storage (paged allocates blocks here)
    k, v = cache.update(layer, k_new, v_new)   # per layer: stage new positions, return 0..T-1
    cache.commit(length)                       # the new positions become valid

Until ``commit`` the valid prefix is untouched, so a rejected call leaves the cache
exactly as it was. Shapes: (B, KVH, T, D) = batch, key/value heads, positions, head width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from kvbench.model import DecoderConfig

CACHE_KINDS = ("concat", "static", "paged")


def expected_cache_bytes(config: DecoderConfig, batch: int, length: int) -> int:
    """Key plus value element storage for `length` positions: 2 * layers * B * KVH * T * D * elt."""
    element = torch.empty((), dtype=config.dtype).element_size()
    return 2 * config.layers * batch * config.kv_heads * length * config.head_dim * element


class Cache:
    """What every kind shares: ownership of one request, its length and its checks."""

    kind = "abstract"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        capacity = config.max_length if capacity is None else capacity
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= config.max_length:
            raise ValueError(f"capacity must be an integer in [1, max_length={config.max_length}], got {capacity!r}")
        self.config = config
        self.batch = batch
        self.capacity = capacity
        self.length = 0

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        """Raise ValueError (naming expected and actual) unless `length` positions can be appended."""
        mine = self.config
        if config is not mine and config != mine:  # identity first: the per-step common case
            for name in ("layers", "kv_heads", "head_dim", "dtype"):
                expected, actual = getattr(mine, name), getattr(config, name)
                if expected != actual:
                    raise ValueError(f"cache {name} mismatch: cache was built with {name}={expected}, model has {name}={actual}")
            raise ValueError(f"cache was built for another model config: cache has {mine}, model has {config}")
        if batch != self.batch:
            raise ValueError(f"cache batch mismatch: cache holds batch {self.batch}, ids have batch {batch}")
        if self.length + length > self.capacity:
            raise ValueError(
                f"position capacity exceeded: cache holds {self.length} of {self.capacity} positions, "
                f"appending {length} needs {self.length + length}"
            )

    def reserve(self, length: int) -> None:
        self._staged = length

    def commit(self, length: int) -> None:
        self.length += length

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def keys(self, layer: int = 0) -> Tensor:
        """Valid keys of one layer, (B, KVH, T, D)."""
        raise NotImplementedError

    def values(self, layer: int = 0) -> Tensor:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes of key/value elements at valid positions, counted from the tensors."""
        return sum(
            t.numel() * t.element_size()
            for layer in range(self.config.layers)
            for t in (self.keys(layer), self.values(layer))
        )

    @property
    def reserved_bytes(self) -> int:
        """Bytes of key/value storage this cache holds, valid or not (>= nbytes)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch={self.batch}, length={self.length}, capacity={self.capacity})"


class ConcatCache(Cache):
    """The source document's cache: torch.cat on every append, copying the prefix each time."""

    kind = "concat"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        super().__init__(config, batch, capacity)
        empty = torch.empty(batch, config.kv_heads, 0, config.head_dim, dtype=config.dtype)
        self._keys = [empty] * config.layers
        self._values = [empty] * config.layers
        # New tensors are staged and swapped in by commit(), so a call that fails
        # part-way leaves the valid prefix untouched.
        self._staged_keys: list[Tensor] = list(self._keys)
        self._staged_values: list[Tensor] = list(self._values)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.length == 0:
            k, v = k.contiguous(), v.contiguous()  # don't retain the whole qkv projection
        else:
            k = torch.cat((self._keys[layer], k), dim=-2)
            v = torch.cat((self._values[layer], v), dim=-2)
        self._staged_keys[layer], self._staged_values[layer] = k, v
        return k, v

    def commit(self, length: int) -> None:
        self._keys, self._staged_keys = self._staged_keys, list(self._staged_keys)
        self._values, self._staged_values = self._staged_values, list(self._staged_values)
        super().commit(length)

    def keys(self, layer: int = 0) -> Tensor:
        return self._keys[layer]

    def values(self, layer: int = 0) -> Tensor:
        return self._values[layer]

    @property
    def reserved_bytes(self) -> int:
        return self.nbytes


class StaticCache(Cache):
    """Preallocated (B, KVH, capacity, D) per layer, written in place; reads see only 0..T-1."""

    kind = "static"

    def __init__(self, config: DecoderConfig, batch: int = 1, capacity: int | None = None) -> None:
        super().__init__(config, batch, capacity)
        shape = (batch, config.kv_heads, self.capacity, config.head_dim)
        self._key_buffers = [torch.zeros(shape, dtype=config.dtype) for _ in range(config.layers)]
        self._value_buffers = [torch.zeros(shape, dtype=config.dtype) for _ in range(config.layers)]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, new = self.length, k.shape[-2]
        keys, values = self._key_buffers[layer], self._value_buffers[layer]
        keys.narrow(2, start, new).copy_(k)  # beyond the valid prefix: invisible until commit
        values.narrow(2, start, new).copy_(v)
        return keys.narrow(2, 0, start + new), values.narrow(2, 0, start + new)

    def keys(self, layer: int = 0) -> Tensor:
        return self._key_buffers[layer][:, :, : self.length]

    def values(self, layer: int = 0) -> Tensor:
        return self._value_buffers[layer][:, :, : self.length]

    @property
    def reserved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._key_buffers, *self._value_buffers))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class BlockPool:
    """Key/value storage for `num_blocks` blocks of `block_size` positions, shared by requests.

    One tensor holds every layer's keys and values: (layers, 2, KVH, num_blocks, block_size, D),
    where index 0 of the second dimension is keys and 1 is values. A block's positions are
    contiguous within each head, so gathering a sequence's blocks in table order yields its
    positions in order. Blocks are handed out from a free list and carry reference counts:
    a block shared by forked requests returns to the free list when its last holder releases it.
    """

    def __init__(self, config: DecoderConfig, num_blocks: int, block_size: int = 16) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.config = config
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (config.layers, 2, config.kv_heads, num_blocks, block_size, config.head_dim)
        with torch.inference_mode(False):  # writable later whether or not inference mode is on
            self.storage = torch.zeros(shape, dtype=config.dtype)
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
    are allocated in reserve(), after the model's checks and before any write. fork() shares
    every block with a new request; a shared, partly filled last block is copied before either
    side appends to it (copy-on-write). Full blocks are never written again, so they stay shared.

    Attention needs each sequence's keys as one (B, KVH, T, D) tensor, and gathering them through
    the table at every step would copy the whole prefix, as concat does. So each request keeps
    a contiguous workspace that mirrors its positions and receives only the new ones: update()
    writes there, as the static cache does, and returns views of it. The workspace writes back
    to the pool a block at a time: commit() copies every block that has just filled into its
    pool block (one tensor op for all layers), and the partly filled last block is written back
    before anything reads the pool or shares it (keys(), values(), fork()). The pool is the
    storage of record: keys()/values() gather through the table, and a fork builds its workspace
    from the pool. The workspace grows geometrically up to capacity (see workspace_bytes).
    """

    kind = "paged"

    def __init__(
        self,
        config: DecoderConfig,
        batch: int = 1,
        capacity: int | None = None,
        block_size: int | None = None,
        pool: BlockPool | None = None,
    ) -> None:
        super().__init__(config, batch, capacity)
        if pool is None:
            size = 16 if block_size is None else block_size
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"block_size must be a positive integer, got {size!r}")
            pool = BlockPool(config, batch * _ceil_div(self.capacity, size), size)
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
        # Appends up to this length need no block, copy or workspace growth: the decode step's
        # fast path. 0 while the last block may be shared or after release.
        self._room = 0
        self._synced = 0  # positions 0.._synced-1 are in the pool; the rest only in the workspace
        self._workspace: Tensor | None = None  # (layers, 2, B, KVH, size, D), size a block multiple
        self._ws_size = 0
        self._ws_keys: list[Tensor] = []  # per-layer (B, KVH, size, D) views of the workspace
        self._ws_values: list[Tensor] = []
        self._ws_blocks: Tensor | None = None  # (layers, 2, B, KVH, size / bs, bs, D) view

    # -- protocol -------------------------------------------------------------------------

    def check_append(self, config: DecoderConfig, batch: int, length: int) -> None:
        if self.released:
            self._check_live()
        super().check_append(config, batch, length)
        if self.length + length > self._room:
            self._check_free_blocks(length)

    def reserve(self, length: int) -> None:
        """Copy shared partial blocks, allocate the blocks `length` more positions need, size the workspace."""
        if self.length + length > self._room:
            self._reserve_blocks(length)
        super().reserve(length)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.released:
            self._check_live()
        start, new = self.length, k.shape[-2]
        keys, values = self._ws_keys[layer], self._ws_values[layer]  # (B, KVH, size, D)
        keys.narrow(2, start, new).copy_(k)  # beyond the valid prefix: invisible until commit
        values.narrow(2, start, new).copy_(v)
        return keys.narrow(2, 0, start + new), values.narrow(2, 0, start + new)

    def commit(self, length: int) -> None:
        super().commit(length)
        full = self.length - self.length % self.block_size
        if full > self._synced:  # blocks that just filled go to the pool
            self._write_back(full)

    # -- requests -------------------------------------------------------------------------

    def fork(self) -> PagedCache:
        """A new request in the same pool sharing all of this one's valid blocks, at the same length."""
        self._check_live()
        self._write_back(self.length)
        child = PagedCache(self.config, self.batch, self.capacity, pool=self.pool)
        used = _ceil_div(self.length, self.block_size)
        child._rows = [row[:used] for row in self._rows]
        for row in child._rows:
            self.pool.share(row)
        child._held = used
        child.length = child._synced = self.length
        if self.length % self.block_size:
            self._tail_shared = child._tail_shared = True
            self._room = 0
        return child

    def release(self) -> None:
        """Give every block back (shared blocks stay with their other holders); the cache is then unusable."""
        self._check_live()
        self.pool.release([block for row in self._rows for block in row])
        self._rows = [[] for _ in range(self.batch)]
        self._held = self.length = self._synced = self._ws_size = self._room = 0
        self._workspace, self._ws_keys, self._ws_values, self._ws_blocks = None, [], [], None
        self.released = True

    # -- reading --------------------------------------------------------------------------

    def keys(self, layer: int = 0) -> Tensor:
        """Valid keys of one layer, (B, KVH, T, D), gathered from the pool through the block table.

        The partly filled last block is written back first, so the pool is complete when read.
        """
        self._check_live()
        self._write_back(self.length)
        return self._gather(self.pool.storage[layer, 0])

    def values(self, layer: int = 0) -> Tensor:
        self._check_live()
        self._write_back(self.length)
        return self._gather(self.pool.storage[layer, 1])

    @property
    def block_table(self) -> Tensor:
        """(B, blocks held per sequence) pool block indices, a copy."""
        return torch.tensor(self._rows, dtype=torch.long).view(self.batch, self._held)

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

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the contiguous attention workspace (outside the pool; not in reserved_bytes)."""
        ws = self._workspace
        return 0 if ws is None else ws.numel() * ws.element_size()

    def __repr__(self) -> str:
        return (
            f"PagedCache(batch={self.batch}, length={self.length}, capacity={self.capacity}, "
            f"block_size={self.block_size}, blocks_held={self.batch * self._held}, released={self.released})"
        )

    # -- internals ------------------------------------------------------------------------

    def _check_live(self) -> None:
        if self.released:
            raise ValueError("cache was released: expected a live cache, got one whose blocks were returned to the pool")

    def _blocks_needed(self, length: int) -> int:
        """Fresh blocks reserve(length) takes: new blocks per row plus copies of shared last blocks."""
        size, start = self.block_size, self.length
        needed = max(0, _ceil_div(start + length, size) - self._held) * self.batch
        if start % size:
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
        self._check_live()
        pool, size, start = self.pool, self.block_size, self.length
        if start + length > self.capacity:
            raise ValueError(
                f"position capacity exceeded: cache holds {start} of {self.capacity} positions, "
                f"reserving {length} needs {start + length}"
            )
        self._check_free_blocks(length)
        if start % size and self._tail_shared:  # the next position falls in a shared block: copy it
            index = start // size
            for row in self._rows:
                if pool.refcount(row[index]) > 1:
                    (fresh,) = pool.allocate(1)
                    pool.copy_block(row[index], fresh)  # complete: fork() wrote it back first
                    pool.release([row[index]])
                    row[index] = fresh
        self._tail_shared = False  # from here on the last block is this request's own
        missing = _ceil_div(start + length, size) - self._held
        if missing > 0:
            for row in self._rows:
                row.extend(pool.allocate(missing))
            self._held += missing
        self._ensure_workspace(start + length)
        self._room = min(self._held * size, self._ws_size)

    def _write_back(self, end: int) -> None:
        """Copy the blocks holding positions _synced..end-1 from the workspace into the pool, whole.

        A block's positions beyond `end` carry whatever the workspace holds there; they are
        invalid and invisible, and the block is this request's own (shared blocks are full or
        were copied by reserve()), so nobody else sees them either.
        """
        start, size = self._synced, self.block_size
        if end <= start:
            return
        first, last = start // size, _ceil_div(end, size)  # blocks first..last-1 of every row
        if self.batch == 1 and last - first == 1:  # a decode step filled one block: no index tensor
            self.pool.storage.select(3, self._rows[0][first]).copy_(self._ws_blocks.select(2, 0).select(3, first))
        else:
            blocks = torch.tensor([row[first:last] for row in self._rows]).view(-1)  # (B * n,), row-major
            staged = self._ws_blocks.narrow(4, first, last - first)  # (layers, 2, B, KVH, n, bs, D)
            self.pool.storage.index_copy_(3, blocks, staged.transpose(2, 3).flatten(3, 4))
        self._synced = end

    def _gather(self, part: Tensor) -> Tensor:
        """(..., KVH, num_blocks, bs, D) pool storage -> (..., B, KVH, T, D) valid positions, via the table."""
        B, T, size = self.batch, self.length, self.block_size
        used = _ceil_div(T, size)
        blocks = torch.tensor([row[:used] for row in self._rows], dtype=torch.long).view(-1)  # (B * used,)
        gathered = part.index_select(-3, blocks)  # (..., KVH, B * used, bs, D)
        gathered = gathered.view(*part.shape[:-3], B, used * size, part.shape[-1])
        return gathered.narrow(-2, 0, T).transpose(-4, -3)

    def _ensure_workspace(self, needed: int) -> None:
        """Make the workspace hold `needed` positions, carrying over the valid prefix."""
        old, have = self._workspace, self._ws_size
        if have >= needed:
            return
        config, T = self.config, self.length
        # Whole blocks, so that write-back can copy whole blocks; geometric, so growing is rare.
        size = _ceil_div(min(self.capacity, max(needed, 2 * have)), self.block_size) * self.block_size
        shape = (config.layers, 2, self.batch, config.kv_heads, size, config.head_dim)
        with torch.inference_mode(False):  # writable later whether or not inference mode is on
            workspace = torch.empty(shape, dtype=config.dtype)
            if old is not None:
                workspace[..., :T, :] = old[..., :T, :]
            elif T:  # a fork: build the mirror from the pool
                workspace[..., :T, :] = self._gather(self.pool.storage)
        self._workspace, self._ws_size = workspace, size
        self._ws_keys = [workspace[layer, 0] for layer in range(config.layers)]
        self._ws_values = [workspace[layer, 1] for layer in range(config.layers)]
        self._ws_blocks = workspace.unflatten(4, (size // self.block_size, self.block_size))


def make_cache(kind: str, config: DecoderConfig, batch: int = 1, capacity: int | None = None, **options) -> Cache:
    """A fresh, empty cache of `kind` for one request of `batch` sequences."""
    if kind == "concat":
        return ConcatCache(config, batch, capacity, **options)
    if kind == "static":
        return StaticCache(config, batch, capacity, **options)
    if kind == "paged":
        return PagedCache(config, batch, capacity, **options)
    raise ValueError(f"cache kind must be one of {list(CACHE_KINDS)}, got {kind!r}")
