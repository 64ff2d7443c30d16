"""The paged kind with a prefix cache (`--prefix-cache`): the ledger that admits a request with the blocks its
tokens find cached (kvbench.cache.prefix) already present, and caches every full block a request computes.

- Keys: a hash chain over each request's own token ids (the TokenSource's: a shared prefix is shared because the
  tokens are the same, not because a length says so), rooted in a namespace naming the model and the kind.
- Admission: a hit's blocks count as present (referenced, not allocated) and its tokens are not prefilled again:
  the request's cache starts at the hit's length, so its prefill starts after the cached prefix, at the same
  absolute positions. At least one prompt token is always computed (its logits give the first output token), so
  a hit covers at most (prompt - 1) // block_size blocks.
- A request whose next uncached blocks a running request is computing right now waits for them instead of
  computing them a second time (SGLang's in-batch prefix check; vLLM computes both): it is admitted once they are
  cached, or once no running request still plans them.
- After every call, each row's newly filled full blocks get their keys (prompt and output tokens alike: a later
  turn of a conversation finds its history). Release, by completion, cancellation or preemption, drops
  references only: a block with a key stays cached until an allocation evicts it (kvbench.cache.prefix).
- Measures, per replay: each request's hit tokens at its first admission (the token hit rate is their sum over
  the prompt tokens), and the blocks evicted.
"""

from __future__ import annotations

import torch

from kvbench.cache import PagedCache
from kvbench.cache.prefix import CachingBlockPool, chain_keys, root_key
from kvbench.model import Decoder
import kvbench.serving.admission as admission
from kvbench.serving.scheduler import Live, PagedLedger
from kvbench.serving.sharing import segments
from kvbench.serving.tokens import TokenSource
from kvbench.serving.trace import MAX_REQUESTS, Trace, TraceRequest

__all__ = ["PrefixLedger", "SharedSource", "namespace"]
DRAW_KEYS = {"prefix": lambda group: -(group + 1), "own": lambda request: request + 1,  # TokenSource's own keys
             "last": lambda request: -(2 * MAX_REQUESTS + request)}  # a turn's last output token: no other key


class SharedSource(TokenSource):
    """The TokenSource of a trace whose requests reuse earlier tokens (kvbench.serving.sharing): one seeded draw per
    segment, so a group's system prompt or a turn's history is the same ids wherever it appears. A request with
    neither gets TokenSource's ids, the same as before (a group 0 prefix is TokenSource's shared prefix)."""

    def __init__(self, vocab_size: int, seed: int, trace: Trace, continuations: dict[int, list[int]] | None = None,
                 text=None):
        super().__init__(vocab_size, seed, trace.prefix, continuations, text)
        self.trace = trace

    def ids(self, request: TraceRequest):
        if request.parent is None and not request.group:
            return super().ids(request)
        if self.continuations is not None:
            raise ValueError(f"request {request.id}: a turn's history or a group's prefix is drawn ids, expected no "
                             "generated continuations (the peer)")
        return torch.cat([self._draw(length, DRAW_KEYS[what](key))  # TokenSource's seeded draw, inherited
                          for what, key, length in segments(self.trace, request)], dim=1)


def namespace(model: Decoder, kind: str) -> str:
    """What a key's root names: the model (its configuration; one pool serves one model's weights) and the kind."""
    return f"{kind}/{sorted(model.config.to_dict().items())!r}"


class PrefixLedger(PagedLedger):
    """A PagedLedger over a CachingBlockPool (no forked holder: the cache shares the prefix instead)."""

    def __init__(self, model: Decoder, budget: int, block_size: int) -> None:
        super().__init__(model, budget, block_size, share_prefix=False, pool=CachingBlockPool)
        self.root = root_key(namespace(model, "paged"))
        self.keys: dict[int, list[bytes]] = {}  # request id -> the key of each full block of its ids
        self.keyed: dict[int, int] = {}  # admitted request id -> its leading full blocks cached or computed
        self.hits: dict[int, int] = {}  # request id -> tokens found cached at its first admission
        self.prompt_blocks: dict[int, int] = {}  # admitted request id -> full blocks it computes before its token
        self.hit_now: dict[int, int] = {}  # admitted request id -> the blocks it found cached

    def chain(self, live: Live) -> list[bytes]:
        if live.spec.id not in self.keys:
            self.keys[live.spec.id] = chain_keys(self.root, live.ids[0].tolist(), self.pool.block_size)
        return self.keys[live.spec.id]

    def hit(self, live: Live) -> list[int]:
        """The cached blocks this request's cache may start with: the longest cached run of its keys, leaving at
        least its last prompt (or fed-back) token to compute."""
        return self.pool.lookup(self.chain(live)[: (live.feed - 1) // self.pool.block_size])

    def cached_tokens(self, live: Live) -> int:
        """Tokens its prompt finds cached now (the longest-prefix-first order ranks the waiting queue by it)."""
        return len(self.hit(live)) * self.pool.block_size

    def in_flight(self, live: Live, found: int) -> bool:
        """Whether the block after its `found` cached ones is being computed by an admitted request."""
        keys = self.chain(live)[found : (live.feed - 1) // self.pool.block_size]
        if not keys:
            return False
        planned = {key for other, done in self.keyed.items()
                   for key in self.keys[other][done : self.prompt_blocks[other]]}
        return keys[0] in planned

    def admit(self, live: Live, max_batched_tokens: int | None = None) -> bool:
        found = self.hit(live)
        if self.in_flight(live, len(found)):
            return False  # it waits for those blocks rather than computing them twice
        need = admission.blocks_for(live.feed, self.pool.block_size) - len(found)
        taken = sum(self.pool.refcount(block) == 0 for block in found)  # evictable blocks referenced again
        if need + taken + self.promised > self.pool.free_blocks:
            return False
        self.pool.acquire(found)
        self.promised += need
        live.cache = PagedCache(self.config, 1, live.spec.positions, pool=self.pool)
        live.cache.adopt(found)
        self.keyed[live.spec.id] = len(found)
        self.prompt_blocks[live.spec.id] = (live.feed - 1) // self.pool.block_size
        self.hits.setdefault(live.spec.id, len(found) * self.pool.block_size)
        self.hit_now[live.spec.id] = len(found)  # a shared block has a holder that found it cached: this one
        return True

    def settle(self, rows: list[Live]) -> None:
        """After a call: every row's newly filled full blocks get their keys."""
        size = self.pool.block_size
        for live in rows:
            full, done = live.cache.length // size, self.keyed[live.spec.id]
            if full > done:  # most calls fill no block: a decode step fills one every block_size steps
                row, keys = live.cache.table_row, self.chain(live)
                for index in range(done, full):
                    self.pool.register(row[index], keys[index])
                self.keyed[live.spec.id] = full

    def release(self, live: Live) -> int:
        self.keyed.pop(live.spec.id, None)
        self.prompt_blocks.pop(live.spec.id, None)
        self.hit_now.pop(live.spec.id, None)
        return super().release(live)

    def snapshot(self, running: list[Live]) -> dict:
        """As the paged kind's, with a shared (hit) block stored once; and the blocks the cache keeps."""
        size, per_position = self.pool.block_size, admission.bytes_per_position(self.config)
        if not any(self.hit_now.get(live.spec.id) for live in running):  # no block is shared: the paged kind's
            return {**super().snapshot(running), "cached_blocks": self.pool.cached_blocks}
        filled: dict[int, int] = {}
        for live in running:
            for index, block in enumerate(live.cache.table_row):
                filled[block] = max(filled.get(block, 0), min(size, live.cache.length - index * size))
        logical = sum(live.cache.length for live in running) * per_position
        used = sum(filled.values()) * per_position
        return {"used": used, "reserved": self.held_bytes(), "saved": max(0, logical - used),
                "free_blocks": self.pool.free_blocks, "cached_blocks": self.pool.cached_blocks}

    def stats(self, requests: int) -> dict:
        """This replay's measures: each request's hit tokens at its first admission, and the blocks evicted."""
        return {"hit_tokens": [self.hits.get(index, 0) for index in range(requests)], "evicted": self.pool.evicted}
