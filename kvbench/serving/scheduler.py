"""Iteration-level scheduling (Orca, vLLM) of a trace under a KV budget, with one model.

Each iteration (the choices of order, admission and preemption are kvbench.serving.disciplines'; defaults here):
  1. requests whose arrival time has come join the waiting queue (arrival order; preempted ones go to its head);
  2. the running requests' next decode token must fit: when the pool cannot hold it, the newest running request is
     preempted (its cache released, its tokens kept: it recomputes later, vLLM's default);
  3. waiting requests are admitted in order while the budget allows (kvbench.serving.admission: static and
     quantized reserve their capacity, quantized with the full-precision window its prompt's chunks will reach, a
     kind that compresses its prompt its uncompressed prompt until a call compresses it; paged needs the blocks of
     its prompt); the first that does not fit stops admission (first come, first served, head of line);
  4. one forward over every running request: every request whose prompt is in its cache decodes its next token,
     all of them in one batched call (each row at its own positions, kvbench.cache.batch); requests still
     prefilling take chunks of their prompts, one call each, in admission order, within a per-iteration token
     budget (max_batched_tokens, counting one per decoding row: chunked prefill as Sarathi and vLLM schedule it,
     so a long prompt never stalls every running request's next token for its whole length; None prefills every
     admitted prompt whole). A chunk that ends its prompt emits the request's first token. A shared prefix's
     holder (paged, share_prefix) takes what the running requests leave of that budget, while the head of the
     queue waits to fork it; once it holds the whole prefix, the requests waiting for it are admitted in the
     same iteration;
  5. a request that emitted its last token, or that its client cancelled, releases its cache in this iteration.
Before admission the order discipline may rank the waiting queue (longest-prefix-first: by prefix cache hits).
Tokens are teacher-forced: request r's ids are fixed (kvbench.serving.tokens), so batching, padding and
preemption never change what is computed, only when. Idle gaps (nothing running, the next arrival
in the future) are skipped, not slept: the clock jumps to that arrival.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kvbench.cache import BlockPool, Cache, PagedCache, make_cache
from kvbench.cache.batch import BatchedCache, Workspace
from kvbench.measure.clock import HOST, Clock
from kvbench.model import Decoder
from kvbench.modes import PAGES, spec
import kvbench.serving.admission as admission
from kvbench.serving.disciplines import Disciplines, reorder
from kvbench.serving.tokens import TokenSource
from kvbench.serving.trace import Trace, TraceRequest


@dataclass
class Live:
    """One request during a replay."""

    spec: TraceRequest
    ids: Tensor
    arrival: float | None
    cache: Cache | None = None
    emitted: int = 0
    admitted: float | None = None  # when it was first admitted
    token_times: list[float] = field(default_factory=list)
    token_cpu_times: list[float] = field(default_factory=list)  # the same on the replay thread's CPU time
    preemptions: int = 0
    reserved: int = 0  # bytes a reserving kind set aside for it
    logits: list[Tensor] | None = None
    history: list | None = None  # an evicting cache's record of the positions each step saw (replay's gate)
    finished: float | None = None

    @property
    def feed(self) -> int:
        """Positions its cache must hold for the next token's logits."""
        return self.spec.prompt + self.emitted

    @property
    def pending(self) -> int:
        """Tokens still to feed before its next token: 1 when decoding, the rest of its prompt while prefilling."""
        return self.feed - self.cache.length

    def outcome(self) -> dict:
        return {"id": self.spec.id, "arrival": self.arrival, "admitted": self.admitted, "token_times": self.token_times,
                "token_cpu_times": self.token_cpu_times, "finished": self.finished,
                "cancelled": self.spec.cancel_after is not None, "preemptions": self.preemptions}


class Ledger:
    """How a kind holds memory under the budget: reserving kinds set the most a request holds aside at admission, so
    they never grow and are never preempted; one that compresses its prompt gives back what that freed (settle)."""

    def __init__(self, model: Decoder, kind: str, budget: int, policy: str, options: dict | None) -> None:
        self.model, self.config, self.kind, self.budget = model, model.config, kind, budget
        self.policy, self.options, self.held, self.shrinks = policy, options or {}, 0, spec(kind).reserve is not None

    def growth_fits(self, rows: list[Live]) -> bool:
        return True

    def held_bytes(self) -> int:
        return self.held

    def cached_tokens(self, live: Live) -> int:  # its prompt's tokens a prefix cache holds (serving.prefix_cache)
        return 0

    def admit(self, live: Live, max_batched_tokens: int | None = None) -> bool:
        """Set `live`'s cache aside if it fits, made for the scheduler's chunk rule (kvbench.admission.cache_options:
        its most tokens per iteration, None for whole prompts), so its reservation is all it ever allocates."""
        capacity = admission.capacity(live.spec, self.config, self.policy)
        options = admission.cache_options(self.kind, live.spec, capacity, self.options, max_batched_tokens)
        need = admission.reservation(self.kind, self.config, capacity, options)
        if self.held + need > self.budget:
            return False
        live.cache = make_cache(self.kind, self.config, 1, capacity, device=self.model.device, **options)
        live.history = getattr(live.cache, "history", None)  # kept past release: the gate masks the full path by it
        live.reserved, self.held = need, self.held + need
        return True

    def settle(self, rows: list[Live]) -> None:
        """After a call: each row's reservation is its cache's (reserved_bytes, which compression lowers)."""
        for live in rows if self.shrinks else ():
            now = live.cache.reserved_bytes
            self.held, live.reserved = self.held - live.reserved + now, now

    def prefill_prefix(self, waiting: deque[Live], source: TokenSource, tokens: int | None) -> int:
        """A chunk of a shared prefix's holder (paged, share_prefix); returns the positions prefilled: none here."""
        return 0

    def release(self, live: Live) -> int:
        live.cache.release()
        live.cache, freed, self.held, live.reserved = None, live.reserved, self.held - live.reserved, 0
        return freed

    def snapshot(self, running: list[Live]) -> dict:
        return {"used": sum(live.cache.nbytes for live in running), "reserved": self.held, "saved": 0}

    def close(self) -> None:
        """Nothing is held across requests."""


class PagedLedger(Ledger):
    """One BlockPool of budget // block bytes blocks (`pool`: its class); requests take blocks on demand. With
    share_prefix, a holder keeps the shared prefix's blocks while a request that has the prefix is still to come,
    and every such request forks it (copy-on-write of a partly filled last block). The holder is prefilled like a
    prompt, in chunks of the iteration's token budget (prefill_prefix); a request with the prefix waits for all of it."""

    def __init__(self, model: Decoder, budget: int, block_size: int, share_prefix: bool, pool: type = BlockPool) -> None:
        super().__init__(model, "paged", budget, "request", None)
        self.pool = pool(self.config, budget // admission.block_bytes(self.config, block_size), block_size,
                              model.device)
        self.share_prefix, self.holder, self.promised = share_prefix, None, 0

    def _forks(self, live: Live) -> bool:
        return bool(self.share_prefix and live.spec.prefix)

    def _need(self, live: Live) -> int:
        """Blocks its prompt takes; a fork shares the holder's full blocks (a partly filled last one is copied)."""
        size = self.pool.block_size
        return admission.blocks_for(live.feed, size) - (live.spec.prefix // size if self._forks(live) else 0)

    def growth_fits(self, rows: list[Live]) -> bool:
        """Whether every row's next token fits (the rest of its prompt, while it prefills in chunks); if so,
        those blocks are promised to it before any admission."""
        needed = sum(live.cache.blocks_needed(live.pending) for live in rows)
        self.promised = needed if needed <= self.pool.free_blocks else 0
        return needed <= self.pool.free_blocks

    def held_bytes(self) -> int:
        return (self.pool.num_blocks - self.pool.free_blocks) * self.pool.block_bytes

    def admit(self, live: Live, max_batched_tokens: int | None = None) -> bool:
        if self._forks(live) and (self.holder is None or self.holder.length < live.spec.prefix):
            return False  # it waits, at the head of the queue, for prefill_prefix to finish the holder
        need = self._need(live)
        if need + self.promised > self.pool.free_blocks:
            return False
        self.promised += need
        live.cache = self.holder.fork() if self._forks(live) else PagedCache(self.config, 1, live.spec.positions,
                                                                               pool=self.pool)
        return True

    def prefill_prefix(self, waiting: deque[Live], source: TokenSource, tokens: int | None) -> int:
        """The holder's next chunk of the shared prefix, at most `tokens` (None: all the rest), while the request at
        the head of the queue waits to fork it (first come, first served: no other request waits behind it), in
        blocks that no admitted request's prompt or running request's next token was promised; returns the
        positions prefilled."""
        if not (waiting and self._forks(waiting[0])):
            return 0
        head = waiting[0]
        if self.holder is not None and self.holder.length >= head.spec.prefix:
            return 0
        if self.holder is None:
            self.holder = PagedCache(self.config, 1, pool=self.pool)
        start = self.holder.length
        count = head.spec.prefix - start if tokens is None else min(tokens, head.spec.prefix - start)
        if count < 1 or self.holder.blocks_needed(count) + self.promised > self.pool.free_blocks:
            return 0
        self.model(source.prefix[:, start : start + count].to(self.model.device), self.holder)
        return count

    def release(self, live: Live) -> int:
        free = self.pool.free_blocks
        live.cache.release()
        live.cache = None
        return (self.pool.free_blocks - free) * self.pool.block_bytes

    def drop_holder(self) -> None:
        if self.holder is not None:
            self.holder.release()
            self.holder = None

    def snapshot(self, running: list[Live]) -> dict:
        """used: token states stored (a shared block once), reserved: blocks held, saved: token states the
        requests hold beyond those stored (what sharing spared)."""
        size, per_position = self.pool.block_size, admission.bytes_per_position(self.config)
        logical = sum(live.cache.length for live in running) * per_position
        if self.holder is None:  # no block is shared: each holds its own positions (and this runs every iteration)
            return {"used": logical, "reserved": self.held_bytes(), "saved": 0, "free_blocks": self.pool.free_blocks}
        filled: dict[int, int] = {}
        caches = [live.cache for live in running] + ([self.holder] if self.holder is not None else [])
        for cache in caches:
            for index, block in enumerate(cache.table_row):  # the Python list: no read of a device tensor
                filled[block] = max(filled.get(block, 0), min(size, cache.length - index * size))
        used = sum(filled.values()) * per_position
        return {"used": used, "reserved": self.held_bytes(), "saved": max(0, logical - used), "free_blocks": self.pool.free_blocks}

    def close(self) -> None:
        self.drop_holder()


def make_ledger(model: Decoder, kind: str, budget: int, policy: str = "request",
                block_size: int = admission.DEFAULT_BLOCK_SIZE, share_prefix: bool = False,
                options: dict | None = None) -> Ledger:
    if spec(kind).serving == PAGES:
        return PagedLedger(model, budget, block_size, share_prefix)
    if share_prefix:
        raise ValueError(f"--share-prefix forks paged blocks: expected kind 'paged', got {kind!r}")
    return Ledger(model, kind, budget, policy, options)


class Scheduler:
    """Replays one trace on one kind; `run()` returns every request's outcome and every iteration's memory."""

    def __init__(self, model: Decoder, trace: Trace, ledger: Ledger, source: TokenSource,
                 keep_logits: bool = False, max_batched_tokens: int | None = None, clock: Clock = HOST,
                 disciplines: Disciplines | None = None) -> None:
        if max_batched_tokens is not None and (isinstance(max_batched_tokens, bool) or not isinstance(
                max_batched_tokens, int) or max_batched_tokens < 1):
            raise ValueError(f"max_batched_tokens must be a positive integer or None, got {max_batched_tokens!r}")
        self.model, self.trace, self.ledger, self.source = model, trace, ledger, source
        self.keep_logits, self.max_batched_tokens, self.clock = keep_logits, max_batched_tokens, clock
        self.disciplines = Disciplines() if disciplines is None else disciplines
        self.device = model.device  # read once: every iteration's ids are made there
        self.workspace = Workspace()  # where every batched call gathers its keys and values (kvbench.cache.batch)
        self.lives = [Live(spec, source.ids(spec).to(self.device), spec.arrival) for spec in trace.requests]
        self.waiting, self.running, self.iterations = deque(), [], []  # of Live, Live and dict
        self.skew = 0.0  # idle gaps skipped
        if trace.arrivals == "closed":  # each client's first request at 0; the next when the previous ends
            for live in self.lives[: trace.clients]:
                live.arrival = 0.0
        self.pending = deque(live for live in self.lives if live.arrival is not None)

    def now(self) -> float:
        """Seconds on the replay's clock since run() began, plus the idle gaps it skipped, to the nanosecond: the
        clock counts integer nanoseconds, so nine decimals keep every one of its digits, where the sum with the
        skew's float would be written with seventeen (docs/serving.md, "The record's size")."""
        return round((self.clock.now_ns() - self.start) / 1e9 + self.skew, 9)

    def run(self) -> dict:
        self.start, self.cpu_start = self.clock.now_ns(), self.clock.cpu_ns()
        with torch.inference_mode():
            try:
                while self.pending or self.waiting or self.running:
                    self.iterate()
            finally:
                for live in self.running:
                    self.ledger.release(live)
                self.ledger.close()
        return {"requests": [live.outcome() for live in self.lives], "iterations": self.iterations}

    def iterate(self) -> None:
        now = self.now()
        if not (self.waiting or self.running) and self.pending[0].arrival > now:
            self.skew += self.pending[0].arrival - now  # nothing to do until then
            now = self.now()
        while self.pending and self.pending[0].arrival <= now:
            self.disciplines.order.arrive(self.waiting, self.pending.popleft())
        preempted = self.make_room()
        reorder(self.disciplines.order, self.waiting, self.ledger.cached_tokens)  # fcfs leaves it as it is
        admitted = self.admit(now)
        begun = self.now()
        decoding = [live for live in self.running if live.pending == 1]
        chunks = self.chunks([live for live in self.running if live.pending > 1], len(decoding))
        used = len(decoding) + sum(count for _, count in chunks)
        prefix_tokens, forks = self.prefill_prefix(now, used)
        admitted += forks
        chunks += self.chunks(forks, used + prefix_tokens)
        prefill_tokens = prefix_tokens + sum(count for _, count in chunks)
        stepped = []
        for live, count in chunks:  # one call each: a prompt is already many rows, and padding prompts wastes work
            stepped += self.forward([live], [count])
        prefilled = self.now()
        stepped += self.forward(decoding, [1] * len(decoding))
        seconds = {"prefill_seconds": round(prefilled - begun, 6), "decode_seconds": round(self.now() - prefilled, 6),
                   "prefill_tokens": prefill_tokens, "decoded": len(decoding)}
        memory = self.ledger.snapshot(self.running)
        freed, ended = self.retire(stepped)
        if not (chunks or decoding or prefix_tokens) and self.waiting:
            raise ValueError(f"request {self.waiting[0].spec.id} cannot be admitted even alone: the KV budget "
                             f"{self.ledger.budget} bytes is below its minimum "
                             "(kvbench.serving.admission.minimum_budget)")
        self.iterations.append({"time": round(self.now(), 6), "running": len(stepped), "waiting": len(self.waiting),
                                "admitted": len(admitted), "preempted": preempted, "ended": ended,
                                "freed": freed, **memory, "reserved_after": self.ledger.held_bytes(), **seconds})

    def chunks(self, prefilling: list[Live], used: int) -> list[tuple[Live, int]]:
        """(request, tokens) of this iteration's prefill chunks, in admission order: what the token budget
        leaves after the `used` tokens (one per decoding row first; without a budget, every prompt whole)."""
        if self.max_batched_tokens is None:
            return [(live, live.pending) for live in prefilling]
        left, chunks = self.max_batched_tokens - used, []
        for live in prefilling:
            if left <= 0:
                break
            chunks.append((live, min(live.pending, left)))
            left -= chunks[-1][1]
        return chunks

    def prefill_prefix(self, now: float, used: int) -> tuple[int, list[Live]]:
        """A shared prefix's holder takes what the token budget leaves after the running requests' `used` tokens
        (it serves the head of the queue, admitted after them); once it holds the whole prefix, the requests that
        waited for it are admitted and fork it in this same iteration. Returns (positions prefilled, admitted)."""
        left = None if self.max_batched_tokens is None else self.max_batched_tokens - used
        prefilled = self.ledger.prefill_prefix(self.waiting, self.source, left)
        return prefilled, self.admit(now) if prefilled else []

    def make_room(self) -> int:
        """Preempt the preemption discipline's victims until every other one's next token fits (asked even with
        none running, so that nothing stays promised from the last iteration)."""
        preempted = 0
        while not self.ledger.growth_fits(self.running):
            victim = self.disciplines.preemption.victim(self.running)
            self.running.remove(victim)
            self.ledger.release(victim)
            victim.preemptions += 1
            self.disciplines.order.requeue(self.waiting, victim)
            preempted += 1
        return preempted

    def admit(self, now: float) -> list[Live]:
        admitted = self.disciplines.admission.admit(self.waiting,
                                                    lambda live: self.ledger.admit(live, self.max_batched_tokens))
        for live in admitted:
            live.admitted = now if live.admitted is None else live.admitted
            self.running.append(live)
        return admitted

    def forward(self, rows: list[Live], counts: list[int]) -> list[Live]:
        """One model call over `rows`, each taking its count of tokens from where its cache stands; returns the
        rows that emitted a token (a prefill chunk that does not end its prompt emits none)."""
        if not rows:
            return []
        width = max(counts)
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)  # padding: token 0, never cached
        ending = [live.pending == count for live, count in zip(rows, counts)]
        for b, (live, count) in enumerate(zip(rows, counts)):
            ids[b, :count] = live.ids[0, live.cache.length : live.cache.length + count]
        logits, _ = self.model(ids, BatchedCache([live.cache for live in rows], counts, self.workspace))
        self.clock.synchronize()  # the tokens exist once the call's work is done, not when it was issued
        stamp, cpu = self.now(), (self.clock.cpu_ns() - self.cpu_start) / 1e9
        self.ledger.settle(rows)
        emitted = []
        for b, (live, count, ends) in enumerate(zip(rows, counts, ending)):
            if not ends:
                continue
            if self.keep_logits:
                live.logits = live.logits if live.logits is not None else []
                live.logits.append(logits[b, count - 1].clone())
            live.emitted += 1
            live.token_times.append(stamp)
            live.token_cpu_times.append(cpu)
            emitted.append(live)
        return emitted

    def retire(self, stepped: list[Live]) -> tuple[int, int]:
        """Release every request that emitted its last token or was cancelled, in this iteration."""
        freed, ended = 0, 0
        for live in stepped:
            if live.emitted < live.spec.emits:
                continue
            self.running.remove(live)
            freed += self.ledger.release(live)
            live.finished, ended = live.token_times[-1], ended + 1
            self.client_next(live)
        if isinstance(self.ledger, PagedLedger) and self.ledger.holder is not None and not any(
                live.spec.prefix and live.finished is None for live in self.lives):
            self.ledger.drop_holder()  # no request left that could fork it
        return freed, ended

    def client_next(self, live: Live) -> None:
        if self.trace.arrivals != "closed":
            return
        following = live.spec.id + self.trace.clients
        if following < len(self.lives):
            self.lives[following].arrival = live.finished
            self.pending.append(self.lives[following])
