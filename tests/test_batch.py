"""kvbench.cache.batch: the addresses a batch of one pool writes and reads, built for the whole batch with tensor
ops, are each row's own block table read position by position; a batch's forward is each row's own forward."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.cache import BlockPool, PagedCache
from kvbench.cache.batch import BatchedCache
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
    batch.reserve(max(new))
    picked, written, read = batch.slots
    assert (picked.tolist(), written.tolist()) == expected_slots(rows, new)
    blocks = read.view(len(rows), -1)
    for b, row in enumerate(rows):
        held = -(-(row.length + new[b]) // SIZE)
        assert blocks[b, :held].tolist() == row.block_table[0, :held].tolist()
        assert blocks[b, held:].tolist() == [0] * (blocks.shape[1] - held)  # padding reads block 0, masked
    batch.rollback()


@pytest.mark.parametrize("new", [[1, 1, 1, 1], [3, 1, 5, 2]])
def test_a_batch_of_one_pool_gives_each_row_its_own_logits(new):
    """Decode (every row one token) and a ragged step: each row's logits are its own forward's, forks included."""
    rows = rows_in_one_pool([5, 17, 9], fork=True, scatter=True)
    alone = [row.fork() for row in rows]  # the same state, stepped one row at a time
    ids = torch.randint(0, CONFIG.vocab_size, (len(rows), max(new)), generator=torch.Generator().manual_seed(1))
    batched, _ = MODEL(ids, BatchedCache(rows, new))
    assert BatchedCache(rows, new).slots is None  # a fresh view: addresses are made by reserve()
    for b, (row, count) in enumerate(zip(alone, new)):
        own, _ = MODEL(ids[b : b + 1, :count], row)
        torch.testing.assert_close(batched[b, :count], own[0], atol=1e-5, rtol=1e-5)
        assert rows[b].length == row.length


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
