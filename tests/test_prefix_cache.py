"""The prefix cache (kvbench.cache.prefix, kvbench.serving.prefix_cache): its lifetime rules over random traces
(a referenced block is never evicted, no block leaks, a key always names its block's tokens, hits give the logits of
the full path), its eviction order, the traces that reuse prefixes and their best hit rate, and the command line."""

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.cache.prefix import CachingBlockPool, chain_keys, root_key
from kvbench.cli import main
from kvbench.model import DecoderConfig, build_model
from kvbench.record import RecordView, load_record
from kvbench.serving import admission
from kvbench.serving.disciplines import LongestPrefixFirst, disciplines
from kvbench.serving.prefix_cache import PrefixLedger, SharedSource, namespace
from kvbench.serving.replay import Replay, gate
from kvbench.serving.scheduler import Scheduler
from kvbench.serving.sharing import best_hit_tokens, make_shaped, parse_shape
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths, trace_from_dict

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONFIG = DecoderConfig(max_length=160)
MODEL = build_model(CONFIG, seed=0)


def settings_of(block_size=4, tokens=24, order="fcfs"):
    return {"block_size": block_size, "share_prefix": False, "max_batched_tokens": tokens, "kind": "paged",
            "prefix_cache": True, "order": order}


class Checked(Scheduler):
    """A scheduler that checks the cache's lifetime rules after every iteration."""

    def iterate(self) -> None:
        super().iterate()
        check_pool(self.ledger, self.running)


def check_pool(ledger: PrefixLedger, running) -> None:
    pool = ledger.pool
    held: dict[int, int] = {}
    for live in running:
        for block in live.cache.table_row:
            held[block] = held.get(block, 0) + 1
    referenced = {block for block in range(pool.num_blocks) if pool.refcount(block) > 0}
    assert referenced == set(held) and all(pool.refcount(block) == count for block, count in held.items())  # no leak
    free = set(pool._free)
    assert not free & set(pool.evictable) and not (free | set(pool.evictable)) & referenced
    assert len(free) + len(pool.evictable) + len(referenced) == pool.num_blocks  # free + cached + referenced = pool
    assert set(pool.evictable) <= set(pool.key_of)  # only cached blocks wait in the queue, never a referenced one
    assert {pool.block_of[key] for key in pool.key_of.values()} == set(pool.key_of)
    for live in running:  # a key always names the tokens its block holds
        keys = ledger.chain(live)
        for index, block in enumerate(live.cache.table_row[: live.cache.length // pool.block_size]):
            assert pool.key_of.get(block, keys[index]) == keys[index]


def shaped_or_drawn(draw):
    if draw(st.booleans()):
        text = draw(st.sampled_from(["shared-prefix:{}", "multi-turn:{}"]))
        numbers = ([draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 30)),
                    draw(st.integers(1, 9)), draw(st.integers(1, 6))] if text.startswith("shared") else
                   [draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 12)), draw(st.integers(1, 6))])
        return make_shaped(parse_shape(text.format(",".join(map(str, numbers)))), draw(st.integers(0, 9)),
                           CONFIG.max_length)
    spec = {**parse_lengths("uniform:2-30,1-8"), **parse_arrivals(draw(st.sampled_from(["all", "closed:2"]))),
            "requests": draw(st.integers(1, 6)), "prefix": draw(st.integers(1, 20)), "prefix_fraction": 0.7,
            "cancel_fraction": 0.3, "cancel_after": 1}
    return make_trace(spec, draw(st.integers(0, 9)), CONFIG.max_length)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_cache_never_evicts_a_referenced_block_leaks_none_and_hits_give_the_full_paths_logits(data):
    trace = shaped_or_drawn(data.draw)
    block_size = data.draw(st.integers(2, 6))
    least = admission.minimum_budget("paged", CONFIG, trace, block_size=block_size)
    budget = least + data.draw(st.integers(0, 12)) * admission.block_bytes(CONFIG, block_size)  # tight: evictions
    tokens = data.draw(st.sampled_from([None, 5, 16]))
    order = data.draw(st.sampled_from(["fcfs", "longest-prefix"]))
    ledger = PrefixLedger(MODEL, budget, block_size)
    source = SharedSource(CONFIG.vocab_size, trace.seed, trace)
    scheduler = Checked(MODEL, trace, ledger, source, True, tokens, disciplines=disciplines(order=order))
    outcome = scheduler.run()
    assert ledger.pool.free_blocks == ledger.pool.num_blocks  # every reference released, cached content kept
    assert len(outcome["requests"]) == len(trace.requests)
    check = gate(MODEL, trace, "paged-prefix", budget, settings_of(block_size, tokens, order))  # the serving gate
    assert check["passed"], check


def test_hits_reach_the_traces_best_and_are_counted_as_present():
    trace = make_shaped(parse_shape("shared-prefix:2,3,40,8,4"), 0, CONFIG.max_length)
    best = best_hit_tokens(trace, 4)
    assert sorted(best) == [0, 0, 40, 40, 40, 40]  # each group's first request computes its 40-token prompt
    replay = Replay(MODEL, trace, "paged-prefix", 64 * admission.block_bytes(CONFIG, 4), settings_of())
    replay.prepare()
    replay()
    assert replay.last["prefix_cache"] == {"hit_tokens": best, "evicted": 0}
    prefilled = sum(iteration["prefill_tokens"] for iteration in replay.last["iterations"])
    assert prefilled == sum(request.prompt for request in trace.requests) - sum(best)  # hits are not prefilled again


def test_a_multi_turn_trace_is_each_turn_its_whole_history_and_a_new_message():
    trace = make_shaped(parse_shape("multi-turn:2,3,10,5"), 0, CONFIG.max_length)
    assert [(r.prompt, r.parent, r.client) for r in trace.requests] == \
        [(10, None, 0), (10, None, 1), (25, 0, 0), (25, 1, 1), (40, 2, 0), (40, 3, 1)]
    source = SharedSource(CONFIG.vocab_size, trace.seed, trace)
    first, second = source.ids(trace.requests[0]), source.ids(trace.requests[2])
    assert torch.equal(second[:, :14], first)  # the history: its prompt and every fed-back output token ...
    assert second[0, 14].item() == source.ids(trace.requests[4])[0, 14].item()  # ... and the last one, in every later turn
    assert not torch.equal(second[:, 15:25], source.ids(trace.requests[3])[:, 15:25])  # its own message
    assert best_hit_tokens(trace, 4) == [0, 0, 12, 12, 28, 28]


def test_an_evictable_block_goes_last_block_first_and_only_when_the_pool_runs_out():
    pool = CachingBlockPool(CONFIG, 4, 2)
    blocks = pool.allocate(3)
    keys = chain_keys(root_key("test"), [1, 2, 3, 4, 5, 6], 2)
    assert all(pool.register(block, key) for block, key in zip(blocks, keys))
    assert not pool.register(pool.allocate(1)[0], keys[0])  # the same tokens computed twice stay uncached once
    pool.release(blocks)
    assert list(pool.evictable) == blocks[::-1] and pool.free_blocks == 3 and pool.evicted == 0
    assert pool.lookup(keys) == blocks
    pool.acquire(pool.lookup(keys[:1]))  # a hit takes its block out of the queue
    assert pool.refcount(blocks[0]) == 1 and blocks[0] not in pool.evictable
    taken = pool.allocate(1)
    assert taken == [blocks[2]] and pool.evicted == 1 and pool.lookup(keys) == blocks[:2]  # the last block went first
    with pytest.raises(ValueError, match="block pool exhausted"):
        pool.allocate(3)


def test_keys_differ_by_model_and_kind_and_by_every_earlier_token():
    other = build_model(DecoderConfig(max_length=160, layers=2), seed=0)
    roots = {root_key(namespace(MODEL, "paged")), root_key(namespace(other, "paged")),
             root_key(namespace(MODEL, "other"))}
    assert len(roots) == 3
    one, two = chain_keys(b"r", [1, 2, 3, 4], 2), chain_keys(b"r", [9, 2, 3, 4], 2)
    assert one[0] != two[0] and one[1] != two[1]  # the second block's tokens agree; its parent does not


def test_longest_prefix_first_ranks_by_cached_tokens_and_keeps_arrival_order_among_equals():
    from collections import deque

    waiting = deque(["a", "b", "c", "d"])
    LongestPrefixFirst().reorder(waiting, {"a": 0, "b": 32, "c": 0, "d": 32}.get)
    assert list(waiting) == ["b", "d", "a", "c"]


def test_a_conversation_turn_that_is_not_its_historys_extension_is_refused(capsys, tmp_path):
    trace = make_shaped(parse_shape("multi-turn:2,2,10,5"), 0, CONFIG.max_length).to_dict()
    trace_from_dict(trace, 160)
    trace["requests"][2]["prompt"] = 15  # the parent's 10 + 5 tokens and no new message
    with pytest.raises(ValueError, match="its history's extension"):
        trace_from_dict(trace, 160)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(trace))
    code = main(["run", "--preset", "seed", "--trace", str(path), "--prefix-cache", "--output", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "history's extension" in err


@pytest.mark.parametrize("args, fragment", [
    (["--modes", "static", "--prefix-cache"], "kind static keeps no prefix cache"),
    (["--modes", "paged,static", "--prefix-cache"], "kind static keeps no prefix cache"),
    (["--queue-order", "longest-prefix"], "--queue-order needs --prefix-cache"),
    (["--prefix-cache", "--share-prefix"], "--share-prefix forks one prefix's holder"),
])
def test_a_prefix_cache_asked_of_a_kind_without_one_is_one_line_exit_2(capsys, tmp_path, args, fragment):
    code = main(["run", "--preset", "seed", "--trace", "shared-prefix:2,2,20,4,4", *args, "--output",
                 str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err


def test_a_run_with_the_prefix_cache_records_and_reports_both_sides(capsys, tmp_path):
    output = tmp_path / "r.json"
    code = main(["run", "--preset", "seed", "--trace", "shared-prefix:2,3,40,8,4", "--prefix-cache", "--queue-order",
                 "longest-prefix", "--repeats", "1", "--control", "none", "--output", str(output), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    view = RecordView(load_record(output), str(output))
    assert view.modes == ["paged", "paged-prefix"] and view.workload.trace == "shared-prefix"
    assert view.serving.settings["paged-prefix"]["order"] == "longest-prefix"
    assert "prefix cache" in out and "token hit rate" in out and "44.4%" in out  # 4 of 6 hit 2 blocks of 16
