"""The scheduler's choices as small objects, chosen by name: the order its waiting queue keeps (`Order`), which
waiting requests an iteration admits (`Admission`), and which running request gives way when the running
requests' next tokens do not fit (`Preemption`). A new choice, a prefix cache's longest-prefix-first order say,
is a new class registered here (`register`); the scheduler's loop does not change.

They are called disciplines, as a queue's discipline is, because "policy" already names the reserve rule
(`--reserve request|max-length`, `Ledger.policy`: how much a reserving kind sets aside, kvbench.serving.admission).
What fits stays the ledger's question (kvbench.serving.scheduler.Ledger): a discipline only decides the order in
which it is asked. Torch-free; requests are the scheduler's `Live` objects, read by their `spec` (TraceRequest).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["ADMISSIONS", "ORDERS", "PREEMPTIONS", "Admission", "Disciplines", "FirstComeFirstServed", "HeadOfLine",
           "LongestPrefixFirst", "NewestFirst", "Order", "Preemption", "disciplines", "register", "reorder"]


class Order(Protocol):
    name: str

    def arrive(self, waiting: deque, live: Any) -> None:
        """A request whose arrival time has come joins the waiting queue."""

    def requeue(self, waiting: deque, live: Any) -> None:
        """A preempted request goes back to the waiting queue, its tokens kept."""

    def reorder(self, waiting: deque, cached: Callable[[Any], int]) -> None:
        """Optional (`reorder`): once an iteration, before admission, rank the waiting queue by something that
        changes while requests wait (`cached(live)`: the tokens of its prompt a prefix cache holds now)."""


class Admission(Protocol):
    name: str

    def admit(self, waiting: deque, fits: Callable[[Any], bool]) -> list:
        """Take the requests this iteration admits out of `waiting`, in the order admitted. `fits(live)` asks the
        ledger, which sets the request's memory aside when it fits: ask only for a request that is then taken."""


class Preemption(Protocol):
    name: str

    def victim(self, running: list) -> Any:
        """The running request that gives way. The scheduler preempts by recompute: it releases the victim's
        cache and keeps its tokens, which the victim prefills again once readmitted (vLLM's default)."""


class FirstComeFirstServed:
    """Arrival order; a preempted request goes back to the head, as it came before everything still waiting."""

    name = "fcfs"

    def arrive(self, waiting: deque, live: Any) -> None:
        waiting.append(live)

    def requeue(self, waiting: deque, live: Any) -> None:
        waiting.appendleft(live)

    def reorder(self, waiting: deque, cached: Callable[[Any], int]) -> None:
        """Arrival order does not change while requests wait."""


class LongestPrefixFirst(FirstComeFirstServed):
    """SGLang's longest-prefix-match schedule: before each admission the waiting requests are ranked by the tokens of
    their prompts the prefix cache holds now, most first; equal ones keep their order (arrival, a preempted one
    ahead). It raises the hit rate when the cache cannot hold every prefix at once, and may starve a request whose
    prefix is never cached while others keep arriving (a trace ends, so here none waits forever)."""

    name = "longest-prefix"

    def reorder(self, waiting: deque, cached: Callable[[Any], int]) -> None:
        ranked = sorted(waiting, key=lambda live: -cached(live))  # stable
        waiting.clear()
        waiting.extend(ranked)


class HeadOfLine:
    """From the head of the queue, stopping at the first request that does not fit: none overtakes one queued
    before it, so a long prompt is never starved by short ones behind it."""

    name = "head-of-line"

    def admit(self, waiting: deque, fits: Callable[[Any], bool]) -> list:
        admitted = []
        while waiting and fits(waiting[0]):
            admitted.append(waiting.popleft())
        return admitted


class NewestFirst:
    """The request that came last in the trace (the highest id) gives way: the one that has waited least."""

    name = "newest"

    def victim(self, running: list) -> Any:
        return max(running, key=lambda live: live.spec.id)


ORDERS: dict[str, type] = {FirstComeFirstServed.name: FirstComeFirstServed, LongestPrefixFirst.name: LongestPrefixFirst}
ADMISSIONS: dict[str, type] = {HeadOfLine.name: HeadOfLine}
PREEMPTIONS: dict[str, type] = {NewestFirst.name: NewestFirst}
TABLES = {"order": ORDERS, "admission": ADMISSIONS, "preemption": PREEMPTIONS}


@dataclass(frozen=True)
class Disciplines:
    """The scheduler's three choices; the defaults are the schedule every replay made before they had names."""

    order: Order = field(default_factory=FirstComeFirstServed)
    admission: Admission = field(default_factory=HeadOfLine)
    preemption: Preemption = field(default_factory=NewestFirst)

    def names(self) -> dict[str, str]:
        return {"order": self.order.name, "admission": self.admission.name, "preemption": self.preemption.name}


def disciplines(order: str = FirstComeFirstServed.name, admission: str = HeadOfLine.name,
                preemption: str = NewestFirst.name) -> Disciplines:
    """The disciplines of these names (a command line's choice), or ValueError naming the known ones."""
    chosen = {}
    for what, name in (("order", order), ("admission", admission), ("preemption", preemption)):
        table = TABLES[what]
        if name not in table:
            raise ValueError(f"{what} discipline must be one of {sorted(table)}, got {name!r}")
        chosen[what] = table[name]()
    return Disciplines(**chosen)


def reorder(order: Order, waiting: deque, cached: Callable[[Any], int]) -> None:
    """The scheduler's call, once an iteration: the order's `reorder`, for an order that has one (an order written
    before it existed keeps its queue as `arrive` and `requeue` left it)."""
    rank = getattr(order, "reorder", None)
    if rank is not None:
        rank(waiting, cached)


def register(what: str, factory: type) -> None:
    """Make a discipline of your own choosable by its class's `name`: `what` is order, admission or preemption."""
    if what not in TABLES:
        raise ValueError(f"a discipline is one of {sorted(TABLES)}, got {what!r}")
    name = getattr(factory, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} discipline needs a class attribute `name`, a non-empty string, got {name!r}")
    if name in TABLES[what] and TABLES[what][name] is not factory:
        raise ValueError(f"{what} discipline {name!r} is already registered, by {TABLES[what][name].__name__}")
    TABLES[what][name] = factory
