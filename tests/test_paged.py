"""The paged cache: block pool, block tables, forks with copy-on-write, release, accounting.

The tiny model keeps every case fast. References are computed independently: a fresh
concat cache fed the same tokens, or the full-prefix forward pass.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.cache import BlockPool, Cache, PagedCache, expected_cache_bytes, make_cache
from kvbench.model import DecoderConfig, build_model, preset_config

ATOL = RTOL = 1e-5
# Two layers and grouped-query attention, so the pool's layer and head dimensions both matter; in both
# families (the llama one's keys are rotated before the pool holds them, so forks must keep their positions).
CONFIGS = {"gpt2": DecoderConfig(layers=2, heads=4, kv_heads=2, max_length=128),
           "llama": preset_config("llama-tiny", vocab_size=128, max_length=128)}
CONFIG = CONFIGS["gpt2"]  # what the tests without a model use; both share vocab_size and layers


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request):
    return build_model(CONFIGS[request.param], seed=0)


def tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CONFIG.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def decode(model, ids: torch.Tensor, cache) -> tuple[torch.Tensor, object]:
    """Feed ids one position at a time; last-position logits of every step, (B, L, V)."""
    steps = []
    for t in range(ids.shape[1]):
        logits, cache = model(ids[:, t : t + 1], cache)
        steps.append(logits[:, -1])
    return torch.stack(steps, dim=1), cache


def snapshot(cache: PagedCache) -> dict:
    return {
        "length": cache.length,
        "table": cache.block_table,
        "keys": [cache.keys(layer).clone() for layer in range(CONFIG.layers)],
        "values": [cache.values(layer).clone() for layer in range(CONFIG.layers)],
    }


def assert_same_snapshot(before: dict, after: dict) -> None:
    assert after["length"] == before["length"]
    assert torch.equal(after["table"], before["table"])
    for name in ("keys", "values"):
        for old, new in zip(before[name], after[name]):
            assert torch.equal(old, new)


# -- equivalence -------------------------------------------------------------------------


def test_small_blocks_match_full_prefix_logits(model):
    """block_size 4: decode steps and a chunk straddling blocks, against the full-prefix pass."""
    ids = tokens(2, 30, seed=1)
    cache = make_cache("paged", model.config, batch=2, capacity=32, block_size=4)
    with torch.inference_mode():
        logits, cache = model(ids[:, :6], cache)  # prefill ends mid-block
        torch.testing.assert_close(logits, model(ids[:, :6])[0], atol=ATOL, rtol=RTOL)
        logits, cache = model(ids[:, 6:15], cache)  # chunk from offset 6 to 15: three block boundaries
        torch.testing.assert_close(logits, model(ids[:, :15])[0][:, 6:], atol=ATOL, rtol=RTOL)
        for t in range(15, 30):
            logits, cache = model(ids[:, t : t + 1], cache)
            reference = model(ids[:, : t + 1])[0][:, -1]
            torch.testing.assert_close(logits[:, -1], reference, atol=ATOL, rtol=RTOL)
        # The same chunks through a concat cache: the projections match bit for bit.
        _, concat = model(ids[:, :6])
        _, concat = model(ids[:, 6:15], concat)
        _, concat = decode(model, ids[:, 15:], concat)
    assert cache.length == 30
    assert cache.block_table.shape == (2, 8)  # ceil(30 / 4) blocks per sequence
    for layer in range(model.config.layers):  # the pool, read through the table, holds the same keys
        assert cache.keys(layer).shape == (2, model.config.kv_heads, 30, model.config.head_dim)
        assert torch.equal(cache.keys(layer), concat.keys(layer))
        assert torch.equal(cache.values(layer), concat.values(layer))


@settings(max_examples=12, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 3, 5, 16]),
    chunks=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=6),
)
def test_any_chunking_stores_what_concat_stores(model, block_size, chunks):
    ids = tokens(1, sum(chunks), seed=block_size)
    paged = make_cache("paged", model.config, capacity=sum(chunks), block_size=block_size)
    concat = make_cache("concat", model.config)
    start = 0
    with torch.inference_mode():
        for chunk in chunks:
            expected, concat = model(ids[:, start : start + chunk], concat)
            actual, paged = model(ids[:, start : start + chunk], paged)
            torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)
            start += chunk
    for layer in range(model.config.layers):
        assert torch.equal(paged.keys(layer), concat.keys(layer))
        assert torch.equal(paged.values(layer), concat.values(layer))
    assert paged.block_table.shape == (1, -(-start // block_size))


# -- forks and copy-on-write -------------------------------------------------------------


def test_fork_mid_block_copies_on_write_and_matches_unshared_requests(model):
    pool = BlockPool(model.config, num_blocks=16, block_size=4)
    prompt = tokens(1, 6, seed=2)  # 6 positions: one full block and a half-filled one
    parent_next, child_next = tokens(1, 7, seed=3), tokens(1, 7, seed=4)
    assert not torch.equal(parent_next, child_next)
    with torch.inference_mode():
        parent = PagedCache(model.config, pool=pool)
        _, parent = model(prompt, parent)
        child = parent.fork()
        assert child.length == parent.length == 6
        assert child.pool is pool
        shared = parent.block_table
        assert torch.equal(child.block_table, shared)
        assert [pool.refcount(b) for b in shared[0].tolist()] == [2, 2]
        assert pool.free_blocks == 14  # the fork took no blocks

        prefix = snapshot(parent)
        # The child writes first: its half-filled shared block must be copied, not written.
        child_logits, child = decode(model, child_next, child)
        child.keys(0)  # reading writes the child's partial last block back to the pool
        assert child.block_table[0, 0] == shared[0, 0]  # the full block stays shared
        assert child.block_table[0, 1] != shared[0, 1]  # the partial block was copied
        assert pool.refcount(shared[0, 0].item()) == 2 and pool.refcount(shared[0, 1].item()) == 1
        assert_same_snapshot(prefix, snapshot(parent))  # untouched by the child's writes
        parent_logits, parent = decode(model, parent_next, parent)
        assert parent.block_table[0, 1] == shared[0, 1]  # now sole owner: written in place

        # Unshared references: fresh concat caches fed the whole sequences.
        parent_ref = decode(model, torch.cat((prompt, parent_next), 1), make_cache("concat", model.config))[0][:, 6:]
        child_ref = decode(model, torch.cat((prompt, child_next), 1), make_cache("concat", model.config))[0][:, 6:]
    torch.testing.assert_close(parent_logits, parent_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(child_logits, child_ref, atol=ATOL, rtol=RTOL)
    assert (parent_logits - child_logits).abs().max() > 1e-3  # the branches really differ
    assert parent.length == child.length == 13


def test_full_blocks_reach_the_pool_at_commit(model):
    """The pool holds every filled block without any read forcing a write-back."""
    ids = tokens(2, 9, seed=20)
    with torch.inference_mode():
        _, cache = decode(model, ids, make_cache("paged", model.config, batch=2, capacity=12, block_size=4))
        _, concat = decode(model, ids, make_cache("concat", model.config, batch=2))
    table = cache.block_table  # (2, 3): positions 0-3, 4-7 and 8
    for layer in range(model.config.layers):
        for b in range(2):
            for index in range(2):
                stored = cache.pool.storage[layer, 0, :, table[b, index]]  # (KVH, bs, D)
                assert torch.equal(stored, concat.keys(layer)[b, :, 4 * index : 4 * index + 4])
    assert torch.equal(cache.keys(1), concat.keys(1))  # and the last partial block on reading


def test_fork_of_a_fork_made_in_inference_mode_works_outside_it(model):
    pool = BlockPool(model.config, num_blocks=12, block_size=4)
    ids = tokens(1, 12, seed=21)
    with torch.inference_mode():
        _, parent = model(ids[:, :5], PagedCache(model.config, pool=pool))
        child = parent.fork()
    _, child = model(ids[:, 5:7], child)
    grandchild = child.fork()
    with torch.no_grad():
        logits, grandchild = model(ids[:, 7:], grandchild)
        reference = model(ids)[0][:, 7:]
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=RTOL)
    assert parent.length == 5 and child.length == 7 and grandchild.length == 12
    assert parent.block_table[0, 0] == child.block_table[0, 0] == grandchild.block_table[0, 0]
    assert pool.refcount(parent.block_table[0, 0].item()) == 3


def test_fork_of_batch_shares_every_row_and_full_blocks_stay_shared(model):
    pool = BlockPool(model.config, num_blocks=20, block_size=4)
    ids = tokens(2, 8, seed=5)  # exactly two full blocks per sequence: nothing to copy
    with torch.inference_mode():
        _, parent = model(ids, PagedCache(model.config, batch=2, pool=pool))
        child = parent.fork()
        _, child = model(tokens(2, 1, seed=6), child)
    assert pool.free_blocks == 20 - 4 - 2  # the child took one new block per sequence, copied none
    assert torch.equal(child.block_table[:, :2], parent.block_table)
    assert all(pool.refcount(b) == 2 for b in parent.block_table.flatten().tolist())


def test_releasing_the_parent_keeps_blocks_shared_with_a_live_fork(model):
    pool = BlockPool(model.config, num_blocks=12, block_size=4)
    ids = tokens(1, 16, seed=7)
    with torch.inference_mode():
        _, parent = model(ids[:, :10], PagedCache(model.config, pool=pool))
        child = parent.fork()
        child_blocks = child.block_table[0].tolist()
        before = snapshot(child)
        parent.release()
        assert pool.free_blocks == 12 - 3  # the three shared blocks stay with the child
        assert [pool.refcount(b) for b in child_blocks] == [1, 1, 1]
        assert_same_snapshot(before, snapshot(child))
        # The child continues correctly, writing in place now that it is the sole owner.
        logits, child = decode(model, ids[:, 10:], child)
        assert child.block_table[0, :3].tolist() == child_blocks
        reference = decode(model, ids, make_cache("concat", model.config))[0][:, 10:]
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=RTOL)


def test_free_count_returns_to_initial_after_every_request_is_released(model):
    pool = BlockPool(model.config, num_blocks=40, block_size=4)
    with torch.inference_mode():
        _, a = model(tokens(2, 7, seed=8), PagedCache(model.config, batch=2, pool=pool))
        b = a.fork()
        _, b = model(tokens(2, 3, seed=9), b)  # copies the shared partial blocks, then appends
        c = b.fork()
        d = a.fork()
        _, e = model(tokens(1, 5, seed=10), PagedCache(model.config, pool=pool))
        _, c = model(tokens(2, 6, seed=11), c)
    assert pool.free_blocks < 40
    for cache in (b, e, a, d, c):  # an order that frees parents before their forks
        cache.release()
    assert pool.free_blocks == 40
    assert [pool.refcount(block) for block in range(40)] == [0] * 40


# -- pool exhaustion -----------------------------------------------------------------------


def test_pool_exhaustion_is_a_value_error_that_changes_nothing(model):
    pool = BlockPool(model.config, num_blocks=6, block_size=4)
    with torch.inference_mode():
        _, a = model(tokens(1, 9, seed=12), PagedCache(model.config, pool=pool))  # 3 blocks
        _, b = model(tokens(1, 5, seed=13), PagedCache(model.config, pool=pool))  # 2 blocks
        assert pool.free_blocks == 1
        before = {name: snapshot(cache) for name, cache in (("a", a), ("b", b))}
        # 8 more positions at length 5 need ceil(13 / 4) - 2 = 2 new blocks; 1 is free.
        with pytest.raises(ValueError, match=r"block pool exhausted.*needs 2 free blocks.*pool has 1 free of 6"):
            model(tokens(1, 8, seed=14), b)
        assert pool.free_blocks == 1
        assert_same_snapshot(before["a"], snapshot(a))
        assert_same_snapshot(before["b"], snapshot(b))
        # What fits still works (4 positions: the last free block), and the failed call left no trace.
        logits, b = model(tokens(1, 4, seed=14), b)
        reference = model(torch.cat((tokens(1, 5, seed=13), tokens(1, 4, seed=14)), 1))[0][:, 5:]
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=RTOL)
    assert pool.free_blocks == 0


def test_copy_on_write_counts_against_the_pool(model):
    """A fork at mid-block needs a fresh block for its first write even though its table has room."""
    pool = BlockPool(model.config, num_blocks=2, block_size=4)
    with torch.inference_mode():
        _, parent = model(tokens(1, 6, seed=15), PagedCache(model.config, pool=pool))
        child = parent.fork()
        before = snapshot(child)
        with pytest.raises(ValueError, match=r"needs 1 free blocks.*pool has 0 free of 2"):
            model(tokens(1, 1, seed=16), child)
    assert_same_snapshot(before, snapshot(child))
    assert [pool.refcount(b) for b in before["table"][0].tolist()] == [2, 2]


def test_rejected_token_ids_allocate_nothing(model):
    pool = BlockPool(model.config, num_blocks=4, block_size=4)
    cache = PagedCache(model.config, pool=pool)
    with torch.inference_mode():
        _, cache = model(tokens(1, 4, seed=17), cache)
        before = snapshot(cache)
        with pytest.raises(ValueError, match="token ids must be in"):
            model(torch.tensor([[1, model.config.vocab_size]]), cache)
    assert pool.free_blocks == 3
    assert_same_snapshot(before, snapshot(cache))


# -- release -----------------------------------------------------------------------------


def test_double_release_and_use_after_release_raise(model):
    pool = BlockPool(model.config, num_blocks=4, block_size=4)
    with torch.inference_mode():
        _, cache = model(tokens(1, 5, seed=18), PagedCache(model.config, pool=pool))
    cache.release()
    assert pool.free_blocks == 4
    assert (cache.length, cache.nbytes, cache.reserved_bytes) == (0, 0, 0)
    with pytest.raises(ValueError, match="released"):
        cache.release()
    with pytest.raises(ValueError, match="released"):
        model(tokens(1, 1, seed=19), cache)
    with pytest.raises(ValueError, match="released"):
        cache.keys(0)
    with pytest.raises(ValueError, match="released"):
        cache.fork()
    assert pool.free_blocks == 4  # the second release returned nothing twice


# -- accounting --------------------------------------------------------------------------

SEED_CONFIG = DecoderConfig()  # 1 layer, 4 KV heads of width 8, float32


@pytest.mark.parametrize(
    "batch, length, reserved, valid",
    [
        # One position of one sequence: 2 (K, V) * 1 layer * 4 heads * 8 * 4 bytes = 256 bytes;
        # one block of 16 positions: 4096 bytes.
        (1, 1, 4096, 256),
        (1, 16, 4096, 4096),
        (1, 17, 8192, 4352),
        (2, 17, 16384, 8704),
        (1, 32, 8192, 8192),
    ],
)
def test_bytes_for_block_size_16(batch, length, reserved, valid):
    model = build_model(SEED_CONFIG, seed=0)
    cache = make_cache("paged", SEED_CONFIG, batch=batch, capacity=64)
    assert cache.pool.block_bytes == 4096
    assert cache.pool.num_blocks == batch * 4  # private pool: ceil(64 / 16) blocks per sequence
    with torch.inference_mode():
        _, cache = model(torch.zeros(batch, length, dtype=torch.long), cache)
    assert cache.reserved_bytes == reserved
    assert cache.nbytes == valid == expected_cache_bytes(SEED_CONFIG, batch, length)
    assert cache.nbytes == Cache.nbytes.fget(cache)  # arithmetic equals counting the gathered tensors
    assert cache.fragmentation_bytes == reserved - valid
    assert cache.fragmentation == pytest.approx((reserved - valid) / reserved)
    assert cache.pool.free_blocks == batch * 4 - reserved // 4096


def test_empty_cache_holds_nothing():
    cache = make_cache("paged", SEED_CONFIG, batch=3, capacity=20)
    assert cache.pool.num_blocks == 6
    assert (cache.nbytes, cache.reserved_bytes, cache.fragmentation_bytes, cache.fragmentation) == (0, 0, 0, 0.0)
    assert cache.block_table.shape == (3, 0)
    assert cache.keys(0).shape == (3, 4, 0, 8)


def test_private_pool_fits_capacity_exactly():
    model = build_model(SEED_CONFIG, seed=0)
    cache = make_cache("paged", SEED_CONFIG, batch=2, capacity=20)  # 2 * ceil(20 / 16) = 4 blocks
    with torch.inference_mode():
        _, cache = model(torch.zeros(2, 20, dtype=torch.long), cache)
        assert cache.pool.free_blocks == 0
        with pytest.raises(ValueError, match="position capacity exceeded.*holds 20 of 20"):
            model(torch.zeros(2, 1, dtype=torch.long), cache)


def test_pool_and_cache_arguments_are_checked():
    with pytest.raises(ValueError, match="block_size must be a positive integer, got 0"):
        PagedCache(SEED_CONFIG, block_size=0)
    with pytest.raises(ValueError, match="num_blocks must be a positive integer, got 0"):
        BlockPool(SEED_CONFIG, num_blocks=0)
    pool = BlockPool(SEED_CONFIG, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="block_size mismatch: pool has block_size 4, got block_size=8"):
        PagedCache(SEED_CONFIG, pool=pool, block_size=8)
    with pytest.raises(ValueError, match="pool layers mismatch: cache needs layers=2, pool has layers=1"):
        PagedCache(CONFIG, pool=pool)
    assert PagedCache(SEED_CONFIG, pool=pool).block_size == 4
    with pytest.raises(ValueError, match="cannot release block 0 1 time"):
        pool.release([0])


# -- random interleavings ------------------------------------------------------------------


def assert_pool_consistent(pool: BlockPool, caches: list[PagedCache]) -> None:
    """Every reference count equals the number of table entries naming the block; the rest are free."""
    holders: dict[int, int] = {}
    for cache in caches:
        for block in cache.block_table.flatten().tolist():
            holders[block] = holders.get(block, 0) + 1
    assert [pool.refcount(b) for b in range(pool.num_blocks)] == [holders.get(b, 0) for b in range(pool.num_blocks)]
    assert pool.free_blocks == pool.num_blocks - len(holders)


@pytest.mark.parametrize("seed", range(3))
def test_random_requests_forks_and_releases_in_one_pool(model, seed):
    """Appends, forks and releases in random order: logits match, bookkeeping adds up, exhaustion is clean."""
    rng = torch.Generator().manual_seed(seed)

    def pick(n: int) -> int:
        return int(torch.randint(n, (1,), generator=rng))

    batch, block_size = 1 + seed % 2, (1, 3, 4)[seed]
    pool = BlockPool(model.config, num_blocks=10 + 6 * seed, block_size=block_size)
    live: list[tuple[PagedCache, torch.Tensor]] = []  # each request and every token it was fed
    with torch.inference_mode():
        for _ in range(25):
            op = pick(10)
            if op < 2 or not live:
                live.append((PagedCache(model.config, batch=batch, capacity=24, pool=pool), tokens(batch, 0, 0)))
            elif op < 4:
                cache, history = live[pick(len(live))]
                live.append((cache.fork(), history))
            elif op < 5:
                live.pop(pick(len(live)))[0].release()
            else:
                index = pick(len(live))
                cache, history = live[index]
                new = torch.randint(model.config.vocab_size, (batch, 1 + pick(5)), generator=rng)
                before = snapshot(cache)
                try:
                    logits, cache = model(new, cache)
                except ValueError as error:  # the pool or the capacity ran out: nothing changed
                    assert "block pool exhausted" in str(error) or "position capacity exceeded" in str(error)
                    assert_same_snapshot(before, snapshot(cache))
                    continue
                history = torch.cat((history, new), dim=1)
                live[index] = (cache, history)
                torch.testing.assert_close(logits, model(history)[0][:, -new.shape[1] :], atol=ATOL, rtol=RTOL)
            assert_pool_consistent(pool, [cache for cache, _ in live])
        for cache, _ in live:
            cache.release()
    assert pool.free_blocks == pool.num_blocks


# -- the read path ---------------------------------------------------------------------------


def _is_view_of_pool(tensor: torch.Tensor, cache: PagedCache) -> bool:
    return tensor.untyped_storage().data_ptr() == cache.pool.storage.untyped_storage().data_ptr()


def test_a_fresh_request_reads_the_pool_without_copying(model):
    ids = tokens(1, 21, seed=30)
    with torch.inference_mode():
        cache = make_cache("paged", model.config, batch=1, capacity=40, block_size=4)
        _, cache = decode(model, ids, cache)
        _, reference = decode(model, ids, make_cache("concat", model.config))
    assert cache.block_table.tolist() == [[0, 1, 2, 3, 4, 5]]  # consecutive: one strided view
    for layer in range(model.config.layers):
        assert _is_view_of_pool(cache.keys(layer), cache) and _is_view_of_pool(cache.values(layer), cache)
        assert torch.equal(cache.keys(layer), reference.keys(layer))
        assert torch.equal(cache.values(layer), reference.values(layer))


def test_scattered_blocks_are_gathered_through_the_table(model):
    """A fork's copied block breaks the run of consecutive blocks: reads then gather, and still match."""
    pool = BlockPool(model.config, num_blocks=16, block_size=4)
    ids = tokens(1, 14, seed=31)
    with torch.inference_mode():
        _, parent = model(ids[:, :6], PagedCache(model.config, pool=pool))
        child = parent.fork()
        _, parent = decode(model, ids[:, 6:], parent)  # copy-on-write of block 1, then new blocks
        _, reference = model(ids[:, :6], make_cache("concat", model.config))
        _, reference = decode(model, ids[:, 6:], reference)
    table = parent.block_table.tolist()[0]
    assert table != list(range(table[0], table[0] + len(table)))
    assert not _is_view_of_pool(parent.keys(0), parent)
    for layer in range(model.config.layers):
        assert torch.equal(parent.keys(layer), reference.keys(layer))
        assert torch.equal(parent.values(layer), reference.values(layer))
    child.release()
    parent.release()
    assert pool.free_blocks == 16


# -- pinned by value: forks shorter than a block, the pool's own accounting ----------------------


def test_a_fork_shorter_than_one_block_shares_it_and_copies_it_on_write(model):
    pool = BlockPool(model.config, num_blocks=2, block_size=4)
    prompt, parent_next, child_next = tokens(1, 3, seed=40), tokens(1, 1, seed=41), tokens(1, 1, seed=42)
    with torch.inference_mode():
        _, parent = model(prompt, PagedCache(model.config, pool=pool))
        child = parent.fork()
        assert child.block_table.tolist() == parent.block_table.tolist() == [[0]]
        assert (pool.refcount(0), pool.free_blocks, child.length) == (2, 1, 3)
        assert child.reserved_bytes == parent.reserved_bytes == pool.block_bytes  # a shared block counts for both
        prefix = snapshot(parent)
        child_logits, child = model(child_next, child)  # block 0 is shared and partly filled: copied first
        assert child.block_table.tolist() == [[1]]
        assert (pool.refcount(0), pool.refcount(1), pool.free_blocks) == (1, 1, 0)
        assert_same_snapshot(prefix, snapshot(parent))
        # The parent now holds block 0 alone: it appends in place, with no free block left.
        parent_logits, parent = model(parent_next, parent)
        assert parent.block_table.tolist() == [[0]] and pool.free_blocks == 0
        parent_ref = model(torch.cat((prompt, parent_next), 1))[0][:, 3:]
        child_ref = model(torch.cat((prompt, child_next), 1))[0][:, 3:]
    torch.testing.assert_close(parent_logits, parent_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(child_logits, child_ref, atol=ATOL, rtol=RTOL)
    child.release()
    assert (pool.refcount(1), pool.free_blocks) == (0, 1)
    parent.release()
    assert pool.free_blocks == 2


def test_a_fork_at_a_block_boundary_shares_full_blocks_and_copies_nothing(model):
    pool = BlockPool(model.config, num_blocks=3, block_size=4)
    with torch.inference_mode():
        _, parent = model(tokens(1, 4, seed=43), PagedCache(model.config, pool=pool))
        child = parent.fork()
        _, child = model(tokens(1, 1, seed=44), child)  # a new block; the full one stays shared
        _, parent = model(tokens(1, 1, seed=45), parent)
    assert child.block_table.tolist() == [[0, 1]] and parent.block_table.tolist() == [[0, 2]]
    assert (pool.refcount(0), pool.free_blocks) == (2, 0)


def test_the_pool_counts_its_bytes_and_hands_out_low_blocks_first():
    pool = BlockPool(CONFIG, num_blocks=5, block_size=3)
    # 2 layers * (K, V) * 2 KV heads * 5 blocks * 3 positions * head width 8 * 4 bytes
    assert pool.nbytes == 2 * 2 * 2 * 5 * 3 * 8 * 4
    assert pool.block_bytes == pool.nbytes // 5
    assert pool.allocate(2) == [0, 1] and pool.free_blocks == 3
    pool.share([1])
    assert (pool.refcount(0), pool.refcount(1), pool.refcount(2)) == (1, 2, 0)
    pool.release([1, 0])
    assert (pool.refcount(1), pool.free_blocks) == (1, 4)
    assert pool.allocate(1) == [0]
    with pytest.raises(ValueError, match="cannot share block 3: expected a held block"):
        pool.share([3])
    with pytest.raises(ValueError, match="cannot release block 1 2 time"):
        pool.release([1, 1])
    assert (pool.refcount(1), pool.free_blocks) == (1, 3)  # a refused release changes nothing
    with pytest.raises(ValueError, match="block pool exhausted: 4 blocks needed, 3 free of 5"):
        pool.allocate(4)
    assert pool.allocate(3) == [2, 3, 4] and pool.free_blocks == 0
    assert repr(pool) == "BlockPool(num_blocks=5, block_size=3, free_blocks=0)"
    for value in (True, 1.0, -1):
        with pytest.raises(ValueError, match="block_size must be a positive integer"):
            BlockPool(CONFIG, num_blocks=1, block_size=value)


def test_every_read_after_release_raises(model):
    with torch.inference_mode():
        _, cache = model(tokens(1, 3, seed=46), PagedCache(model.config, block_size=4))
    cache.release()
    assert cache.released and cache.block_table.shape == (1, 0)
    for read in (cache.keys, cache.values):
        with pytest.raises(ValueError, match="cache was released"):
            read(0)
    assert repr(cache).endswith("blocks_held=0, released=True)")


def test_defaults_are_blocks_of_16_and_layer_0(model):
    assert BlockPool(model.config, num_blocks=1).block_size == 16
    with torch.inference_mode():
        _, cache = model(tokens(1, 3, seed=47), PagedCache(model.config, block_size=4))
    assert cache.batch == 1
    assert torch.equal(cache.keys(), cache.keys(0)) and not torch.equal(cache.keys(), cache.keys(1))
    assert torch.equal(cache.values(), cache.values(0)) and not torch.equal(cache.values(), cache.values(1))


def test_a_failure_after_reserve_gives_back_new_and_copied_blocks(model, monkeypatch):
    """A fork's first append copies its shared partial block and takes a new one; a failure in the forward
    pass after that must hand both back and leave the table, the length and the shared block as they were."""
    import kvbench.model as model_module

    pool = BlockPool(model.config, num_blocks=8, block_size=4)
    with torch.inference_mode():
        _, parent = model(tokens(1, 6, seed=48), PagedCache(model.config, pool=pool))
        child = parent.fork()
        before, free = snapshot(child), pool.free_blocks

        def failing(*args, **kwargs):
            raise RuntimeError("boom")

        monkeypatch.setattr(model_module, "causal_attention", failing)
        with pytest.raises(RuntimeError, match="boom"):
            model(tokens(1, 3, seed=49), child)  # 6 + 3 positions: a copy of block 1 and a new block
    assert_same_snapshot(before, snapshot(child))
    assert pool.free_blocks == free and [pool.refcount(b) for b in before["table"][0].tolist()] == [2, 2]
    monkeypatch.undo()
    with torch.inference_mode():
        _, child = model(tokens(1, 3, seed=49), child)  # and the fork still works
    assert child.length == 9 and pool.refcount(before["table"][0, 1].item()) == 1


def test_a_fork_that_steps_while_its_parent_rolls_back_a_copy_needs_what_its_next_append_takes(model):
    """Parent and fork share a partly filled block. The parent's call copies it and fails before its commit; the fork
    steps in between, holding that block alone, so it appends without a copy. The parent's rollback takes the block
    back: whatever the fork's next append then takes, blocks_needed (what a scheduler promises) must have said, and
    each request keeps its own positions."""
    pool = BlockPool(model.config, num_blocks=6, block_size=4)
    prompt, child_next, parent_next = tokens(1, 5, seed=50), tokens(1, 2, seed=51), tokens(1, 1, seed=52)
    with torch.inference_mode():
        _, parent = model(prompt, PagedCache(model.config, pool=pool))
        child = parent.fork()  # block 1 holds position 4, shared
        before = snapshot(parent)
        parent.check_append(model.config, 1, 1)
        parent.reserve(1)  # the parent's call copies block 1 ...
        assert parent.block_table.tolist() == [[0, 2]] and pool.refcount(1) == 1
        first, child = model(child_next[:, :1], child)  # ... the fork steps meanwhile ...
        parent.rollback()  # ... and the parent's call fails: block 1 is shared again, block 2 free
        assert parent.block_table.tolist() == child.block_table.tolist() == [[0, 1]]
        assert (pool.refcount(0), pool.refcount(1), pool.refcount(2), pool.free_blocks) == (2, 2, 0, 4)
        needed, free = child.blocks_needed(1), pool.free_blocks
        second, child = model(child_next[:, 1:], child)
        assert free - pool.free_blocks == needed == 1  # the block is shared again: the fork copies it to append
        assert child.block_table[0, 1] != 1 and pool.refcount(1) == 1
        assert_same_snapshot(before, snapshot(parent))
        parent_logits, parent = model(parent_next, parent)  # the parent's own append copies the shared block
        assert parent.block_table[0, 0] == child.block_table[0, 0] == 0
        assert parent.block_table[0, 1] != child.block_table[0, 1] and pool.refcount(1) == 1
        child_ref = model(torch.cat((prompt, child_next), 1))[0][:, 5:]
        parent_ref = model(torch.cat((prompt, parent_next), 1))[0][:, 5:]
    torch.testing.assert_close(torch.cat((first, second), 1), child_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(parent_logits, parent_ref, atol=ATOL, rtol=RTOL)
    assert child.length == 7 and parent.length == 6


# -- adopt: a prefix cache's hit -------------------------------------------------------------------


def test_adopted_blocks_are_read_in_table_order_and_only_an_empty_single_sequence_adopts(model):
    pool = BlockPool(model.config, num_blocks=6, block_size=4)
    prompt, other, following = tokens(1, 8, seed=53), tokens(1, 4, seed=54), tokens(1, 2, seed=55)
    with torch.inference_mode():
        _, owner = model(prompt[:, :4], PagedCache(model.config, pool=pool))  # block 0
        model(other, PagedCache(model.config, pool=pool))  # block 1, between the owner's blocks
        _, owner = model(prompt[:, 4:], owner)  # block 2
        assert owner.block_table.tolist() == [[0, 2]]
        pool.share([0, 2])  # the hit's references, taken before adopt as the prefix cache takes them
        adopter = PagedCache(model.config, pool=pool)
        adopter.adopt([0, 2])
        assert (adopter.length, adopter.block_table.tolist(), pool.refcount(0), pool.refcount(2)) == (8, [[0, 2]], 2, 2)
        for layer in range(model.config.layers):  # blocks 0 and 2, not the consecutive slots of blocks 0 and 1
            assert torch.equal(adopter.keys(layer), owner.keys(layer))
            assert torch.equal(adopter.values(layer), owner.values(layer))
        logits, adopter = model(following, adopter)  # the next position starts a block of its own
        assert adopter.block_table.tolist() == [[0, 2, 3]]
        reference = model(torch.cat((prompt, following), 1))[0][:, 8:]
        missed = PagedCache(model.config, pool=pool)
        missed.adopt([])  # a miss: nothing adopted, the cache stays empty and usable
        assert (missed.length, missed.block_table.shape) == (0, (1, 0))
        _, missed = model(other, missed)
        assert torch.equal(missed.block_table, torch.tensor([[4]]))
        for cache, why in ((owner, "batch 1 at length 8"),
                           (PagedCache(model.config, batch=2, pool=pool), "batch 2 at length 0")):
            with pytest.raises(ValueError, match=f"adopt starts an empty cache of batch 1, got {why}"):
                cache.adopt([0])
        with pytest.raises(ValueError, match="adopting 2 blocks of 4 positions exceeds capacity 7"):
            PagedCache(model.config, capacity=7, pool=pool).adopt([0, 2])
    torch.testing.assert_close(logits, reference, atol=ATOL, rtol=RTOL)
    assert (pool.refcount(0), pool.refcount(2)) == (2, 2)
