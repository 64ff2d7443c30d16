"""A prefix cache over the paged kind's pool: full blocks that outlive their request (vLLM's automatic prefix
caching).

A full block is keyed by a hash chain: key(i) = sha256(key(i - 1) + the block's token ids), and key(-1), the
root, hashes a namespace naming the model and the cache kind, so no block is found by another model or kind. A
key therefore names every token from position 0 to the block's end: a hit is the same tokens at the same absolute
positions, so its keys and values (rotated at those positions) are what the request would have computed.

Lifetimes: a block is *referenced* while some request's block table holds it (its reference count, as in
BlockPool), *cached* once it has a key, and *evictable* when it is cached and nobody references it. A released
block with a key goes to the evictable queue (least recently released first; a request's blocks in reverse, so
its last block is evicted first, as vLLM does), not to the free list; it is evicted (its key forgotten, its block
handed out again) only when an allocation finds no free block left. A referenced block is never in that queue,
so it is never evicted. `free_blocks` counts both free and evictable blocks: what an allocation can take.

Not modelled: partly filled blocks are never cached (vLLM neither); no extra keys (LoRA ids, multimodal hashes,
cache salts) beyond the namespace; eviction is LRU by release time only (SGLang's radix tree evicts leaves, which
this chain's last-block-first order approximates).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from kvbench.cache.paged import BlockPool

__all__ = ["CachingBlockPool", "chain_keys", "root_key"]


def root_key(namespace: str) -> bytes:
    """The chain's root for one namespace (a model and a cache kind)."""
    return hashlib.sha256(f"kvbench.prefix/{namespace}".encode()).digest()


def chain_keys(root: bytes, ids: list[int], block_size: int) -> list[bytes]:
    """The key of every full block of `ids`, in position order: each hashes its parent's key and its own ids."""
    keys, parent = [], root
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hashlib.sha256(parent + array("q", ids[start : start + block_size]).tobytes()).digest()
        keys.append(parent)
    return keys


class CachingBlockPool(BlockPool):
    """A BlockPool whose released full blocks stay findable by key until an allocation needs them back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block_of: dict[bytes, int] = {}  # key -> the cached block holding it
        self.key_of: dict[int, bytes] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, oldest first
        self.evicted = 0  # blocks whose key was forgotten to hand them out again

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take: the free ones and the evictable ones."""
        return super().free_blocks + len(self.evictable)

    @property
    def cached_blocks(self) -> int:
        return len(self.key_of)

    def allocate(self, count: int) -> list[int]:
        """Free blocks first; then evict the least recently released cached blocks, only as many as needed."""
        if count > self.free_blocks:
            raise ValueError(f"block pool exhausted: {count} blocks needed, {self.free_blocks} free or evictable "
                             f"of {self.num_blocks}")
        while super().free_blocks < count:  # BlockPool's own: the free list alone
            block, _ = self.evictable.popitem(last=False)
            del self.block_of[self.key_of.pop(block)]
            self.evicted += 1
            self._free.append(block)  # the subclass keeps BlockPool's free list and reference counts
        return super().allocate(count)

    def release(self, blocks: list[int]) -> None:
        """One holder fewer for each block; a block nobody holds goes to the evictable queue if it has a key (the
        request's last block first in line), else to the free list."""
        freed = len(self._free)
        super().release(blocks)  # appends the blocks nobody holds any more to the free list, in `blocks`' order
        released, kept = self._free[freed:], []
        del self._free[freed:]
        for block in reversed(released):
            if block in self.key_of:
                self.evictable[block] = None
            else:
                kept.append(block)
        self._free.extend(reversed(kept))

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The cached blocks of the longest run of `keys` from the first: a prefix hit (nothing taken yet)."""
        found = []
        for key in keys:
            block = self.block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def acquire(self, blocks: list[int]) -> None:
        """One more holder for each hit block: an evictable one leaves the queue, referenced again."""
        for block in blocks:
            if block in self.evictable:
                del self.evictable[block]
                self._refcounts[block] = 1
            else:
                self.share([block])

    def register(self, block: int, key: bytes) -> bool:
        """Give a referenced full block its key, unless that key is already cached (a block of the same tokens
        computed twice stays uncached, and returns to the free list when released). Returns whether it was kept."""
        if self.refcount(block) < 1:
            raise ValueError(f"register caches a referenced block: block {block} has reference count 0")
        if key in self.block_of or block in self.key_of:
            return False
        self.block_of[key], self.key_of[block] = block, key
        return True
