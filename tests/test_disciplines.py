"""The scheduler's disciplines (kvbench.serving.disciplines): the defaults replay the committed records' schedules
iteration for iteration, and another order or preemption changes exactly what it says."""

import json
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvbench.config import DecoderConfig
from kvbench.serving import admission
from kvbench.serving import disciplines as chosen
from kvbench.serving.disciplines import Disciplines, FirstComeFirstServed, NewestFirst, disciplines, register
from kvbench.serving.scheduler import Scheduler, TokenSource, make_ledger
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths, trace_from_dict

RESULTS = Path(__file__).resolve().parents[1] / "results" / "serving"
# What an iteration decided, not how long it took: these are the same on any machine when every request
# arrives at once.
SCHEDULE = ("running", "waiting", "admitted", "preempted", "ended", "freed", "used", "reserved", "saved",
            "free_blocks", "reserved_after", "prefill_tokens", "decoded")


class ShapesOnly:
    """A model that takes every cache through the protocol (check, reserve, commit) and computes nothing: a
    schedule depends on positions, blocks and bytes, never on the values, so a long record replays in seconds."""

    def __init__(self, config: DecoderConfig) -> None:
        self.config, self.device = config, torch.device("cpu")

    def __call__(self, ids, cache):
        batch, length = ids.shape
        cache.check_append(self.config, batch, length)
        cache.reserve(length)
        cache.commit(length)
        return torch.zeros(batch, length, 1), cache


def replay(model, trace, kind, budget, settings, discipline=None):
    options = dict(settings)
    tokens = options.pop("max_batched_tokens", None)
    ledger = make_ledger(model, kind, budget, **options)
    source = TokenSource(model.config.vocab_size, trace.seed, trace.prefix)
    return Scheduler(model, trace, ledger, source, False, tokens, disciplines=discipline).run()


def schedule(result):
    return ([[iteration.get(key) for key in SCHEDULE] for iteration in result["iterations"]],
            [request["preemptions"] for request in result["requests"]])


@pytest.mark.parametrize("name", ["llama-mini-chat-16", "llama-mini-chat-16-max-length", "llama-mini-prefix-64"])
def test_the_default_disciplines_make_the_committed_records_schedules(name):
    """Written before the disciplines had names: chat-16's paged replay preempts 14 times, prefix-64 forks a
    shared prefix, max-length reserves whole capacities."""
    record = json.loads((RESULTS / f"{name}.json").read_text())
    config = DecoderConfig.from_dict(record["config"])
    trace = trace_from_dict(record["trace"], config.max_length)
    assert trace.arrivals == "all"
    for kind in record["kinds"]:
        written = next(sample["replay"] for sample in record["samples"] if sample["mode"] == kind)
        made = replay(ShapesOnly(config), trace, kind, record["budget"]["bytes"], record["settings"][kind],
                      disciplines())
        assert schedule(made) == schedule(written), (name, kind)
    assert name != "llama-mini-chat-16" or sum(schedule(written)[1]) == 14  # the preemptions were exercised


class OldestFirst:
    name = "oldest"

    def victim(self, running):
        return min(running, key=lambda live: live.spec.id)


class ShortestPromptFirst:
    name = "shortest-prompt"

    def arrive(self, waiting, live):
        at = next((i for i, other in enumerate(waiting) if other.spec.prompt > live.spec.prompt), len(waiting))
        waiting.insert(at, live)

    def requeue(self, waiting, live):
        waiting.appendleft(live)


def tiny_replay(discipline):
    config = DecoderConfig(max_length=96)
    trace = make_trace({**parse_lengths("uniform:3-40,20-40"), **parse_arrivals("all"), "requests": 8}, 3, 96)
    model = ShapesOnly(config)
    budget = 12 * admission.block_bytes(config, 16)  # 12 blocks of 16 positions: about a third of what all 8 need
    return trace, replay(model, trace, "paged", budget, {"block_size": 16}, discipline)


def test_another_preemption_takes_its_victims_and_another_order_admits_in_its_order():
    trace, newest = tiny_replay(None)
    _, oldest = tiny_replay(Disciplines(preemption=OldestFirst()))
    preempted = [[r["id"] for r in result["requests"] if r["preemptions"]] for result in (newest, oldest)]
    assert preempted[0] and preempted[1] and preempted[0] != preempted[1]
    assert min(preempted[1]) < min(preempted[0])  # the oldest gives way, not the newest
    _, shortest = tiny_replay(Disciplines(order=ShortestPromptFirst()))
    first, first_fcfs = ({r["id"] for r in result["requests"] if r["admitted"] == min(
        q["admitted"] for q in result["requests"])} for result in (shortest, newest))  # the first iteration's admissions
    by_prompt = [r.id for r in sorted(trace.requests, key=lambda r: (r.prompt, r.id))]
    assert first == set(by_prompt[: len(first)]) and first_fcfs == set(range(len(first_fcfs))) and first != first_fcfs


def test_the_defaults_are_first_come_first_served_from_the_head_and_the_newest_gives_way():
    waiting = deque()
    order = FirstComeFirstServed()
    lives = [SimpleNamespace(spec=SimpleNamespace(id=i)) for i in range(4)]
    for live in lives[:3]:
        order.arrive(waiting, live)
    order.requeue(waiting, lives[3])
    assert [live.spec.id for live in waiting] == [3, 0, 1, 2]
    taken = disciplines().admission.admit(waiting, lambda live: live.spec.id != 1)  # 1 does not fit: 2 waits too
    assert [live.spec.id for live in taken] == [3, 0] and [live.spec.id for live in waiting] == [1, 2]
    assert NewestFirst().victim(lives) is lives[3]
    assert disciplines().names() == {"order": "fcfs", "admission": "head-of-line", "preemption": "newest"}


def test_a_registered_discipline_is_chosen_by_name_and_unknown_names_are_refused_by_name(monkeypatch):
    monkeypatch.setitem(chosen.TABLES, "preemption", dict(chosen.PREEMPTIONS))
    register("preemption", OldestFirst)
    assert isinstance(disciplines(preemption="oldest").preemption, OldestFirst)
    with pytest.raises(ValueError, match=r"order discipline must be one of \['fcfs', 'longest-prefix'\], got 'lifo'"):
        disciplines(order="lifo")
    with pytest.raises(ValueError, match=r"a discipline is one of \['admission', 'order', 'preemption'\], got 'evict'"):
        register("evict", OldestFirst)
    with pytest.raises(ValueError, match="preemption discipline 'newest' is already registered, by NewestFirst"):
        register("preemption", type("Other", (), {"name": "newest"}))
