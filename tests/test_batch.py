"""kvbench.cache.batch: the addresses a batch of one pool writes and reads, built for the whole batch with tensor
ops, are each row's own block table read position by position; a batch's forward is each row's own forward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench import modes
from kvbench.cache import BlockPool, EvictingCache, PagedCache, make_cache
from kvbench.cache.batch import BatchedCache, Workspace
from kvbench.cache.evicting import masked_reference
from kvbench.model import build_model, preset_config

CONFIG = preset_config("llama-tiny", vocab_size=64, max_length=128)
MODEL = build_model(CONFIG, seed=0)
SIZE = 4


def rows_in_one_pool(lengths: list[int], fork: bool, scatter: bool) -> list[PagedCache]:
    """Paged rows prefilled to `lengths`; `fork`: the last row forks the first (shared blocks, a shared tail);
    `scatter`: a throwaway request takes blocks between every prefill, so no row's blocks are consecutive."""
    pool, rows = BlockPool(CONFIG, 200, SIZE), []
    generator = torch.Generator().manual_seed(0)
    for length in lengths:
        if scatter:
            PagedCache(CONFIG, 1, pool=pool).reserve(SIZE)  # a block held between this row's blocks and the next
        row = PagedCache(CONFIG, 1, 128, pool=pool)
        MODEL(torch.randint(0, CONFIG.vocab_size, (1, length), generator=generator), row)
        rows.append(row)
    if fork:
        rows.append(rows[0].fork())
    return rows


def expected_slots(rows: list[PagedCache], new: list[int]) -> tuple[list[int], list[int]]:
    """(index in the (B, L) grid, pool slot) of every new token, from each row's own table, one by one."""
    width, picked, written = max(new), [], []
    for b, (row, count) in enumerate(zip(rows, new)):
        table = row.block_table[0].tolist()
        for j in range(count):
            position = row.length + j
            picked.append(b * width + j)
            written.append(table[position // SIZE] * SIZE + position % SIZE)
    return picked, written


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6), data=st.data(), fork=st.booleans(),
       scatter=st.booleans())
def test_a_batch_addresses_every_new_token_and_block_as_its_rows_table_does(lengths, data, fork, scatter):
    rows = rows_in_one_pool(lengths, fork, scatter)
    new = data.draw(st.lists(st.integers(1, 9), min_size=len(rows), max_size=len(rows)))
    batch = BatchedCache(rows, new)
    batch.check_append(CONFIG, len(rows), max(new))
    free = rows[0].pool.free_blocks
    batch.reserve(max(new))
    picked, written, read = batch.slots
    assert (picked.tolist(), written.tolist()) == expected_slots(rows, new)
    blocks = read.view(len(rows), -1)
    for b, row in enumerate(rows):
        held = -(-(row.length + new[b]) // SIZE)
        assert blocks[b, :held].tolist() == row.block_table[0, :held].tolist()
        assert blocks[b, held:].tolist() == [0] * (blocks.shape[1] - held)  # padding reads block 0, masked
    assert read.numel() == len(rows) * -(-batch.key_mask.shape[-1] // SIZE)  # the longest row's blocks, no more
    batch.rollback()  # every row gives back what reserve took: the pool and each row as before
    assert [row.length for row in rows] == lengths + ([lengths[0]] if fork else [])
    assert rows[0].pool.free_blocks == free
    assert [row.block_table.shape[1] for row in rows] == [-(-row.length // SIZE) for row in rows]


@pytest.mark.parametrize("lengths, new", [([5, 17, 9], [1, 1, 1, 1]), ([5, 17, 9], [3, 1, 5, 2]), ([6], [3])])
def test_a_batch_of_one_pool_gives_each_row_its_own_logits(lengths, new):
    """Decode (every row one token), a ragged step and a batch of one request: each row's logits are its own
    forward's, forks included."""
    rows = rows_in_one_pool(lengths, fork=len(lengths) > 1, scatter=True)
    alone = [row.fork() for row in rows]  # the same state, stepped one row at a time
    ids = torch.randint(0, CONFIG.vocab_size, (len(rows), max(new)), generator=torch.Generator().manual_seed(1))
    batched, _ = MODEL(ids, BatchedCache(rows, new))
    assert BatchedCache(rows, new).slots is None  # a fresh view: addresses are made by reserve()
    for b, (row, count) in enumerate(zip(alone, new)):
        own, _ = MODEL(ids[b : b + 1, :count], row)
        torch.testing.assert_close(batched[b, :count], own[0], atol=1e-5, rtol=1e-5)
        assert rows[b].length == row.length


@pytest.mark.parametrize("kind", ["paged", "static"])
def test_a_workspace_kept_across_calls_holds_stale_keys_that_no_row_sees(kind):
    """One Workspace through three decode steps, the longest rows first: the later, shorter steps find the earlier
    keys in it past their own, and each row's logits are still its own forward's; a call that fits takes no new
    buffer, and each decode row attends to its own keys (key_lengths) only."""
    rows = rows_in_one_pool([5, 17, 9], fork=False, scatter=True) if kind == "paged" else [
        make_cache("static", CONFIG, 1, 64) for _ in range(3)]
    if kind == "static":
        for row, length in zip(rows, [5, 17, 9]):
            MODEL(torch.randint(0, CONFIG.vocab_size, (1, length), generator=torch.Generator().manual_seed(length)), row)
    workspace, buffers = Workspace(), []
    generator = torch.Generator().manual_seed(2)
    for chosen in ([0, 1, 2], [0, 2], [2]):
        batch_rows = [rows[b] for b in chosen]
        alone = [row.fork() if kind == "paged" else copy_static(row) for row in batch_rows]  # the same state, alone
        ids = torch.randint(0, CONFIG.vocab_size, (len(batch_rows), 1), generator=generator)
        view = BatchedCache(batch_rows, [1] * len(batch_rows), workspace)
        assert view.key_lengths == tuple(row.length + 1 for row in batch_rows)
        batched, _ = MODEL(ids, view)
        buffers.append(workspace.nbytes)
        for b, row in enumerate(alone):
            own, _ = MODEL(ids[b : b + 1], row)
            torch.testing.assert_close(batched[b], own[0], atol=1e-5, rtol=1e-5)
    assert buffers[0] > 0 and buffers[1] == buffers[2] == buffers[0]  # the shorter calls fit: nothing new


def copy_static(row):
    """A static row's twin holding the same keys and values, to be stepped on its own."""
    twin = make_cache("static", CONFIG, 1, 64)
    for layer in range(CONFIG.layers):
        twin.update(layer, row.keys(layer), row.values(layer))
    twin.commit(row.length)
    return twin


def test_a_later_rows_failed_reserve_gives_back_what_the_earlier_rows_took():
    """Each row alone fits the one free block, so the batch's checks pass; the second row's reserve then finds the
    pool empty, and the block the first row took must go back (a leak would shrink the pool for good)."""
    pool = BlockPool(CONFIG, 3, SIZE)
    rows = [PagedCache(CONFIG, 1, 128, pool=pool) for _ in range(2)]
    for row in rows:
        MODEL(torch.ones(1, SIZE, dtype=torch.long), row)  # one full block each
    tables = [row.block_table.tolist() for row in rows]
    batch = BatchedCache(rows, [1, 1])
    batch.check_append(CONFIG, 2, 1)  # each row's next block fits alone
    with pytest.raises(ValueError, match="at length 4 needs 1 free blocks of 4 positions, pool has 0 free of 3"):
        batch.reserve(1)
    assert pool.free_blocks == 1 and [pool.refcount(block) for block in range(3)] == [1, 1, 0]
    assert [row.block_table.tolist() for row in rows] == tables and [row.length for row in rows] == [SIZE, SIZE]
    MODEL(torch.ones(1, 1, dtype=torch.long), rows[1])  # and the block is there for the next call
    assert pool.free_blocks == 0 and rows[1].length == SIZE + 1


def static_rows(lengths: list[int]) -> list:
    """Rows of another kind than paged: each its own cache, driven one by one (no pool to address at once)."""
    generator, rows = torch.Generator().manual_seed(0), []
    for length in lengths:
        rows.append(make_cache("static", CONFIG, 1, 128))
        MODEL(torch.randint(0, CONFIG.vocab_size, (1, length), generator=generator), rows[-1])
    return rows


@pytest.mark.parametrize("new", [[1, 1, 1], [3, 1, 5]])
def test_a_batch_of_caches_of_their_own_gives_each_row_its_own_logits(new):
    rows = static_rows([5, 17, 9])
    alone = static_rows([5, 17, 9])  # the same prefills, stepped one row at a time
    ids = torch.randint(0, CONFIG.vocab_size, (len(rows), max(new)), generator=torch.Generator().manual_seed(1))
    batch = BatchedCache(rows, new)
    batched, _ = MODEL(ids, batch)
    assert batch.slots is None and batch.batch == 3 and batch.config is CONFIG
    for b, (row, count) in enumerate(zip(alone, new)):
        own, _ = MODEL(ids[b : b + 1, :count], row)
        torch.testing.assert_close(batched[b, :count], own[0], atol=1e-5, rtol=1e-5)
        assert rows[b].length == row.length
    assert batch.nbytes == sum(row.nbytes for row in rows) and batch.reserved_bytes == sum(r.reserved_bytes for r in rows)


def test_paged_rows_of_two_pools_or_beside_another_kind_are_driven_one_by_one():
    """One pool addressed at once needs every row in it: rows of two pools, or a paged row beside a static one,
    each read their own blocks."""
    def paged_in(pool, length, seed):
        row = PagedCache(CONFIG, 1, 128, pool=pool)
        MODEL(torch.randint(0, CONFIG.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)), row)
        return row

    def two_pools():
        return [paged_in(BlockPool(CONFIG, 40, SIZE), 6, 0), paged_in(BlockPool(CONFIG, 40, SIZE), 9, 1)]

    def paged_and_static():
        return [paged_in(BlockPool(CONFIG, 40, SIZE), 6, 0), *static_rows([9])]

    ids = torch.randint(0, CONFIG.vocab_size, (2, 1), generator=torch.Generator().manual_seed(2))
    for make in (two_pools, paged_and_static):
        rows, alone = make(), make()
        batch = BatchedCache(rows, [1, 1])
        batched, _ = MODEL(ids, batch)
        assert batch.slots is None
        for b, row in enumerate(alone):
            own, _ = MODEL(ids[b : b + 1], row)
            torch.testing.assert_close(batched[b, :1], own[0], atol=1e-5, rtol=1e-5)


def test_a_workspace_keeps_a_quarter_more_than_asked_so_a_row_that_grows_reuses_it():
    workspace, like = Workspace(), torch.zeros(1)
    first = workspace.take("keys", (2, 50), like)  # 100 asked: 125 held
    assert workspace.nbytes == 125 * 4 and first.shape == (2, 50)
    grown = workspace.take("keys", (2, 62), like)  # 124 fit in the same buffer
    assert grown.data_ptr() == first.data_ptr() and workspace.nbytes == 125 * 4
    workspace.take("keys", (2, 63), like)  # 126 do not: a new buffer, again a quarter more
    assert workspace.nbytes == (126 + 31) * 4


def test_a_ragged_batch_reads_each_rows_positions_and_masks_its_padding():
    rows = static_rows([2, 5])
    batch = BatchedCache(rows, [3, 1])
    assert batch.row_positions.tolist() == [[2, 3, 4], [5, 5, 5]]  # a padded query repeats its row's last position
    mask = batch.key_mask[:, 0].int().tolist()  # (B, L, S): S = 6 keys, the longest row's positions 0..5
    assert mask[0] == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert mask[1] == [[1, 1, 1, 1, 1, 1]] * 3


@pytest.mark.parametrize("new, fragment", [
    ([1], "one new-token count per row cache, got 2 caches and 1 counts"),
    ([1, 0], r"every row takes at least one new token, got \[1, 0\]"),
    ([1, True], "every row takes at least one new token"),
    ([1, 1.0], "every row takes at least one new token"),
])
def test_a_batch_refuses_counts_that_do_not_match_its_rows(new, fragment):
    with pytest.raises(ValueError, match=fragment):
        BatchedCache(static_rows([2, 3]), new)
    with pytest.raises(ValueError, match="got 0 caches and 0 counts"):
        BatchedCache([], [])


def test_a_batch_refuses_a_row_of_two_sequences_or_a_ring_of_keys():
    with pytest.raises(ValueError, match="one sequence whose keys are its positions"):
        BatchedCache([make_cache("static", CONFIG, 2, 16)], [1])
    ring = make_cache("static", CONFIG, 1, 16)
    ring.key_positions = torch.tensor([0, 5, 6])  # keys that are not 0..T-1, as a window's ring returns
    with pytest.raises(ValueError, match="one sequence whose keys are its positions"):
        BatchedCache([make_cache("static", CONFIG, 1, 16), ring], [1, 1])
    assert BatchedCache([make_cache("static", CONFIG, 1, 16)], [2]).row_positions.tolist() == [[0, 1]]


def test_a_call_of_another_shape_than_the_batch_is_refused():
    batch = BatchedCache(static_rows([2, 3]), [2, 1])
    for batch_size, length in ((3, 2), (2, 1)):
        with pytest.raises(ValueError, match=f"expected ids \\(2, 2\\), got \\({batch_size}, {length}\\)"):
            batch.check_append(CONFIG, batch_size, length)


SCORED = [name for name, *_ in modes.SCORED_KINDS]


def distinct_ids(total: int, seed: int) -> torch.Tensor:
    """Ids without a repeat: under RoPE the same token's key has the same norm at every position, so knorm would
    meet exact ties that a batch's rounding may break the other way (its top-k would differ by a tie, not a bug)."""
    return torch.randperm(CONFIG.vocab_size, generator=torch.Generator().manual_seed(seed))[:total][None]


@pytest.mark.parametrize("kind", SCORED)
def test_a_batch_of_scored_requests_gives_each_its_own_logits_and_keeps_what_it_keeps_alone(kind):
    """Four requests of their own prompt lengths, fed in prompt chunks of varying sizes (one token among them) beside
    other rows' decoding steps: every call's logits are each request's own call alone, each head keeps what it keeps
    alone, and the whole is the full path masked to what it kept (kvbench.cache.evicting.masked_reference)."""
    prompts, generated = [20, 9, 33, 15], 6
    options = {"kv_keep": 8, "evict_every": 2} if kind not in ("snapkv", "pyramidkv") else {"evict_ratio": 0.5}
    ids = [distinct_ids(prompt + generated, seed) for seed, prompt in enumerate(prompts)]
    rows, alone = ([make_cache(kind, CONFIG, 1, prompt + generated, history=True, prompt=prompt, **options)
                    for prompt in prompts] for _ in range(2))
    logits = [[] for _ in prompts]  # every position's logits, as the batch computed them
    with torch.inference_mode():
        for call in range(40):
            active = [b for b, row in enumerate(rows) if row.length < prompts[b] + generated]
            if not active:
                break
            counts = [min(prompts[b] - rows[b].length, (7, 1, 5, 3)[(b + call) % 4]) if rows[b].length < prompts[b]
                      else 1 for b in active]
            batch_ids = torch.zeros(len(active), max(counts), dtype=torch.long)
            for i, (b, count) in enumerate(zip(active, counts)):
                batch_ids[i, :count] = ids[b][0, rows[b].length : rows[b].length + count]
            batch = BatchedCache([rows[b] for b in active], counts)
            batched, _ = MODEL(batch_ids, batch)
            for i, (b, count) in enumerate(zip(active, counts)):
                own, _ = MODEL(batch_ids[i : i + 1, :count], alone[b])
                torch.testing.assert_close(batched[i, :count], own[0], atol=1e-5, rtol=1e-5)
                logits[b].append(batched[i, :count])
                for layer in range(CONFIG.layers):
                    assert torch.equal(rows[b].positions(layer), alone[b].positions(layer)), (b, layer)
        assert not active
        for b, row in enumerate(rows):
            assert row.compressions >= 1 and row.positions(0).shape[:2] == (1, CONFIG.kv_heads)
            reference = masked_reference(MODEL, ids[b], row.history)[0]
            torch.testing.assert_close(torch.cat(logits[b]), reference, atol=2e-5, rtol=2e-5)


class FirstLayerThinned(EvictingCache):
    """Drops its odd positions past 4 at layer 0 only: a row whose keys carry positions at one layer and not at the
    next (as a pyramid's budget can leave a layer whole)."""

    kind = "first-layer-thinned"

    def choose(self, layer, positions, scores):
        return positions[(positions >= 4) & (positions % 2 == 1)] if layer == 0 else None


def mixed_rows(prompts: list[int]) -> list:
    """A row thinned at layer 0 only, a per-head one (knorm) and a static one, prefilled with the same ids each time."""
    rows = [FirstLayerThinned(CONFIG, 1, 64), make_cache("knorm", CONFIG, 1, 64, kv_keep=6, prompt=prompts[1]),
            make_cache("static", CONFIG, 1, 64)]
    for row, prompt, seed in zip(rows, prompts, range(3)):
        MODEL(distinct_ids(prompt, seed), row)
    return rows


def test_a_row_masked_by_its_positions_at_one_layer_sees_its_whole_prefix_at_the_next():
    """One row keeps every position at layer 1 after thinning layer 0, beside a per-head row (the mask is (B, KVH,
    L, S)) and a static one: each gets its own call's logits."""
    prompts = [10, 12, 7]
    with torch.inference_mode():
        rows, alone = mixed_rows(prompts), mixed_rows(prompts)
        ids = torch.randint(0, CONFIG.vocab_size, (3, 1), generator=torch.Generator().manual_seed(3))
        batch = BatchedCache(rows, [1, 1, 1])
        batched, _ = MODEL(ids, batch)
        assert batch.key_mask.shape == (3, CONFIG.kv_heads, 1, 13)
        assert rows[0].positions(0).numel() < rows[0].positions(1).numel() == 11
        assert rows[1].positions(0).shape == (1, CONFIG.kv_heads, 6 + 1)
        for b, row in enumerate(alone):
            own, _ = MODEL(ids[b : b + 1], row)
            torch.testing.assert_close(batched[b], own[0], atol=1e-5, rtol=1e-5)
