import math

import pytest
import torch

from kvbench.attention import attention_scores, causal_attention, causal_mask, per_query_head, visibility


def reference_attention(q, k, v, offset, window=None, key_positions=None, sinks=0):
    """Explicit scores, softmax and a mask from absolute positions, one head at a time."""
    B, H, L, D = q.shape
    group = H // k.shape[1]
    positions = key_positions if key_positions is not None else torch.arange(k.shape[2])
    out = torch.empty_like(q)
    for h in range(H):
        kh, vh = k[:, h // group], v[:, h // group]
        scores = q[:, h] @ kh.transpose(-1, -2) / math.sqrt(D)
        for i in range(L):
            query = offset + i
            slid = (positions <= query - window) & (positions >= sinks) if window else torch.zeros_like(positions, dtype=torch.bool)
            hidden = (positions > query) | slid
            scores[:, i, hidden] = float("-inf")
        out[:, h] = scores.softmax(-1) @ vh
    return out


def test_mask_is_rectangular_and_offset_aware():
    # Prefix of seven, chunk of five: the first new query sees 0..7.
    mask = causal_mask(offset=7, length=5)
    assert mask.shape == (5, 12)
    assert mask[0].nonzero().flatten().tolist() == list(range(8))
    assert mask[4].all()
    assert [int(row.sum()) for row in mask] == [8, 9, 10, 11, 12]


def test_single_query_sees_whole_prefix():
    mask = causal_mask(offset=9, length=1)
    assert mask.all() and mask.shape == (1, 10)


def test_top_left_triangle_would_be_wrong():
    top_left = torch.ones(1, 10, dtype=torch.bool).tril()
    assert not torch.equal(causal_mask(9, 1), top_left)


@pytest.mark.parametrize("offset, length", [(0, 1), (0, 6), (5, 1), (7, 5), (3, 2)])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_matches_explicit_reference(offset, length, heads, kv_heads):
    generator = torch.Generator().manual_seed(offset * 10 + length)
    q = torch.randn(2, heads, length, 8, generator=generator)
    k = torch.randn(2, kv_heads, offset + length, 8, generator=generator)
    v = torch.randn(2, kv_heads, offset + length, 8, generator=generator)
    torch.testing.assert_close(causal_attention(q, k, v, offset), reference_attention(q, k, v, offset), atol=1e-5, rtol=1e-5)


def test_chunk_after_prefix_equals_rows_of_full_attention():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 12, 8, generator=generator)
    k = torch.randn(1, 4, 12, 8, generator=generator)
    v = torch.randn(1, 4, 12, 8, generator=generator)
    full = causal_attention(q, k, v, offset=0)
    chunk = causal_attention(q[:, :, 7:], k, v, offset=7)
    torch.testing.assert_close(chunk, full[:, :, 7:], atol=1e-6, rtol=1e-6)


def test_key_count_must_match_offset_plus_queries():
    q, k = torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 5, 8)
    with pytest.raises(ValueError, match="offset 2 \\+ 2 queries but 5 keys"):
        causal_attention(q, k, k, offset=2)


# --- a sliding window ---------------------------------------------------------------------------


@pytest.mark.parametrize("offset, length, window", [
    (0, 1, 3), (0, 6, 3), (0, 6, 10), (5, 1, 3), (7, 5, 3), (7, 5, 20), (9, 1, 10), (2, 6, 4),
])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_a_window_matches_the_explicit_reference(offset, length, window, heads, kv_heads):
    generator = torch.Generator().manual_seed(offset * 100 + length * 10 + window)
    q = torch.randn(2, heads, length, 8, generator=generator)
    k = torch.randn(2, kv_heads, offset + length, 8, generator=generator)
    v = torch.randn(2, kv_heads, offset + length, 8, generator=generator)
    torch.testing.assert_close(causal_attention(q, k, v, offset, window),
                               reference_attention(q, k, v, offset, window), atol=1e-5, rtol=1e-5)


def test_a_window_with_the_keys_in_ring_order_and_their_positions():
    """A ring buffer hands over its keys in slot order: positions say who is who."""
    generator = torch.Generator().manual_seed(3)
    window, offset, length = 4, 9, 3
    q = torch.randn(1, 4, length, 8, generator=generator)
    k = torch.randn(1, 4, offset + length, 8, generator=generator)
    v = torch.randn(1, 4, offset + length, 8, generator=generator)
    expected = reference_attention(q, k, v, offset, window)
    kept = torch.tensor([7, 8, 5, 6, 9, 10, 11])  # the ring (positions 5..8 in slot order), then the chunk
    got = causal_attention(q, k[:, :, kept], v[:, :, kept], offset, window, key_positions=kept)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_last_w_keys_in_any_order_need_no_mask_for_one_query():
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(1, 4, 1, 8, generator=generator)
    k = torch.randn(1, 4, 12, 8, generator=generator)
    v = torch.randn(1, 4, 12, 8, generator=generator)
    expected = reference_attention(q, k, v, offset=11, window=4)
    ring = torch.tensor([10, 11, 8, 9])  # slot order of a ring of four after twelve positions
    got = causal_attention(q, k[:, :, ring], v[:, :, ring], offset=11, window=4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


# --- attention sinks beside a window (StreamingLLM) ---------------------------------------------


@pytest.mark.parametrize("offset, length, window, sinks", [
    (0, 12, 3, 2), (9, 1, 3, 2), (9, 1, 3, 4), (7, 5, 3, 1), (2, 6, 4, 4), (20, 3, 5, 30), (1, 1, 3, 2),
])
def test_sinks_keep_the_first_positions_visible_beside_the_window(offset, length, window, sinks):
    generator = torch.Generator().manual_seed(offset * 100 + length * 10 + window + sinks)
    q = torch.randn(2, 4, length, 8, generator=generator)
    k = torch.randn(2, 2, offset + length, 8, generator=generator)
    v = torch.randn(2, 2, offset + length, 8, generator=generator)
    expected = reference_attention(q, k, v, offset, window, sinks=sinks)
    torch.testing.assert_close(causal_attention(q, k, v, offset, window, sinks=sinks), expected, atol=1e-5, rtol=1e-5)
    if offset + length > window + sinks:  # the sinks change what the queries see
        assert not torch.allclose(expected, reference_attention(q, k, v, offset, window), atol=1e-3)


def test_sinks_with_a_ring_in_slot_order_and_their_positions():
    generator = torch.Generator().manual_seed(5)
    window, sinks, offset = 4, 2, 11
    q = torch.randn(1, 4, 1, 8, generator=generator)
    k = torch.randn(1, 4, offset + 1, 8, generator=generator)
    v = torch.randn(1, 4, offset + 1, 8, generator=generator)
    kept = torch.tensor([0, 1, 10, 11, 8, 9])  # the sinks, then the ring of 4 in slot order
    got = causal_attention(q, k[:, :, kept], v[:, :, kept], offset, window, key_positions=kept, sinks=sinks)
    torch.testing.assert_close(got, reference_attention(q, k, v, offset, window, sinks=sinks), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [2, 3])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
def test_several_queries_at_offset_one_see_the_first_key(length, heads, kv_heads):
    """offset 1 is the smallest rectangle: the square shortcut (a lower triangle from the top-left corner)
    would hide each query's own key."""
    generator = torch.Generator().manual_seed(length)
    q = torch.randn(1, heads, length, 8, generator=generator)
    k = torch.randn(1, kv_heads, 1 + length, 8, generator=generator)
    v = torch.randn(1, kv_heads, 1 + length, 8, generator=generator)
    torch.testing.assert_close(causal_attention(q, k, v, 1), reference_attention(q, k, v, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("offset, length, window, start", [(9, 3, 4, 3), (9, 1, 4, 2), (9, 1, 4, 5), (6, 2, 2, 1), (7, 3, 3, 4)])
def test_keys_that_start_after_position_0_are_trimmed_to_the_window(offset, length, window, start):
    """A cache that already let its earliest positions go hands over keys start..offset+length-1: the ones
    no query can see are dropped counting from `start`, not from position 0."""
    generator = torch.Generator().manual_seed(offset + start)
    q = torch.randn(1, 4, length, 8, generator=generator)
    k = torch.randn(1, 2, offset + length, 8, generator=generator)
    v = torch.randn(1, 2, offset + length, 8, generator=generator)
    expected = reference_attention(q, k, v, offset, window)
    got = causal_attention(q, k[:, :, start:], v[:, :, start:], offset, window)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_keys_starting_after_position_0_need_a_window():
    q, k = torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 3, 8)
    with pytest.raises(ValueError, match="offset 2 \\+ 2 queries but 3 keys"):
        causal_attention(q, k, k, offset=2)
    causal_attention(q, k, k, offset=2, window=3)  # the same keys under a window are the last three: accepted


@pytest.mark.parametrize("offset, length", [(0, 4), (2, 2)])
def test_grouped_heads_are_told_by_head_counts_whatever_the_batch_and_key_count(offset, length):
    """Batch, heads and keys all 4, with 2 KV heads: only the head dimensions say the attention is grouped."""
    generator = torch.Generator().manual_seed(offset)
    q = torch.randn(4, 4, length, 8, generator=generator)
    k = torch.randn(4, 2, 4, 8, generator=generator)
    v = torch.randn(4, 2, 4, 8, generator=generator)
    torch.testing.assert_close(causal_attention(q, k, v, offset), reference_attention(q, k, v, offset),
                               atol=1e-5, rtol=1e-5)


def test_a_key_mask_gives_each_sequence_its_own_visible_keys():
    """A batch of requests at their own lengths, padded to the longest (kvbench.cache.batch): each sequence's
    newest query sees its own keys and none of the padding. Batch, heads and keys are all 4 with 2 KV heads,
    so only the head counts can say the attention is grouped."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(4, 4, 1, 8, generator=generator)
    k = torch.randn(4, 2, 4, 8, generator=generator)
    v = torch.randn(4, 2, 4, 8, generator=generator)
    lengths = [4, 1, 3, 2]  # the keys each sequence holds; the rest of its row is padding
    key_mask = torch.tensor([[slot < n for slot in range(4)] for n in lengths]).view(4, 1, 1, 4)
    attended = causal_attention(q, k, v, offset=0, key_mask=key_mask)
    for row, n in enumerate(lengths):
        alone = reference_attention(q[row : row + 1], k[row : row + 1, :, :n], v[row : row + 1, :, :n], offset=n - 1)
        torch.testing.assert_close(attended[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def test_a_key_mask_over_several_queries_each_row_causal_in_its_own_sequence():
    """Two queries a sequence (a prefill chunk of two requests at their own lengths): batch and queries both
    equal the 2 KV heads of 4 query heads, so again only the head counts can say the attention is grouped."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 2, 8, generator=generator)
    k = torch.randn(2, 2, 3, 8, generator=generator)
    v = torch.randn(2, 2, 3, 8, generator=generator)
    lengths = [3, 2]  # the second sequence's third slot is padding
    key_mask = torch.tensor([[[slot <= n - 2 + row for slot in range(3)] for row in range(2)] for n in lengths])
    attended = causal_attention(q, k, v, offset=0, key_mask=key_mask[:, None])
    for at, n in enumerate(lengths):
        alone = reference_attention(q[at : at + 1], k[at : at + 1, :, :n], v[at : at + 1, :, :n], offset=n - 2)
        torch.testing.assert_close(attended[at : at + 1], alone, atol=1e-5, rtol=1e-5)

def test_a_key_mask_refuses_a_window():
    q, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="needs full attention, got window 2"):
        causal_attention(q, k, k, offset=1, window=2, key_mask=torch.ones(1, 1, 1, 2, dtype=torch.bool))


def test_visibility_keeps_no_sink_unless_asked():
    queries, keys = torch.arange(3, 5), torch.arange(5)
    assert visibility(queries, keys, window=2).tolist() == [[False, False, True, True, False],
                                                             [False, False, False, True, True]]
    assert visibility(queries, keys, window=2, sinks=1).tolist() == [[True, False, True, True, False],
                                                                      [True, False, False, True, True]]


# --- the weights an evicting kind reads, per-KV-head positions, a batch at its own lengths --------------------


def sees(query, key, window=None, sinks=0):
    """Whether the query at absolute position `query` sees the key at `key`, written out."""
    return key <= query and (window is None or key > query - window or key < sinks)


def visible_keys(B, KVH, L, S, offset, window=None, key_positions=None, sinks=0):
    """(B, KVH, L, S) booleans, one entry at a time: query i (position offset + i) of row b sees key j of KV head
    kv. key_positions: None (the contiguous offset + L - S..offset + L - 1), (S,) or (B, KVH, S)."""
    if key_positions is None:
        key_positions = torch.arange(offset + L - S, offset + L)
    positions = key_positions.expand(B, KVH, S)
    return torch.tensor([[[[sees(offset + i, int(positions[b, kv, j]), window, sinks) for j in range(S)]
                           for i in range(L)] for kv in range(KVH)] for b in range(B)])


def reference_weights(q, k, visible):
    """Explicit softmax(q k^T / sqrt(D)) over the visible keys, (B, H, L, S), one query head at a time; visible is
    (B, 1 or KVH, L, S) and each query head reads the KV head it shares with its group."""
    B, H, L, D = q.shape
    group = H // k.shape[1]
    weights = torch.empty(B, H, L, k.shape[2], dtype=q.dtype)
    for h in range(H):
        kv = h // group
        scores = q[:, h] @ k[:, kv].transpose(-1, -2) / math.sqrt(D)
        hidden = ~visible[:, kv if visible.shape[1] > 1 else 0]
        weights[:, h] = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return weights


def reference_summed(weights, kv_heads):
    """(B, KVH, S): each key's weight summed over the queries and the query heads of its KV head."""
    B, H, L, S = weights.shape
    group = H // kv_heads
    summed = torch.zeros(B, kv_heads, S, dtype=weights.dtype)
    for h in range(H):
        for i in range(L):
            summed[:, h // group] += weights[:, h, i]
    return summed


def reference_output(weights, v):
    """(B, H, L, D): each query head's weights times the values of its KV head."""
    group = weights.shape[1] // v.shape[1]
    return torch.stack([weights[:, h] @ v[:, h // group] for h in range(weights.shape[1])], dim=1)


def tensors(seed, B, H, KVH, L, S, D=8):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, heads, length, D, generator=generator, dtype=torch.float64)
                 for heads, length in ((H, L), (KVH, S), (KVH, S)))


def assert_scores(q, k, visible, **arguments):
    """attention_scores' "weights" and "summed" against the explicit reference, for the same arguments."""
    expected = reference_weights(q, k, visible)
    tight = dict(atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(attention_scores(q, k, summary="weights", **arguments), expected, **tight)
    torch.testing.assert_close(attention_scores(q, k, summary="summed", **arguments),
                               reference_summed(expected, k.shape[1]), **tight)
    torch.testing.assert_close(attention_scores(q, k, **arguments), reference_summed(expected, k.shape[1]), **tight)


@pytest.mark.parametrize("kv_heads", [1, 2, 3, 6])
def test_per_query_head_gives_each_query_head_its_kv_heads_mask_row(kv_heads):
    """Heads 6, queries 4, keys 5 and batch 2, all different, so that no dimension stands in for another. A mask
    SDPA can broadcast (one row for all heads, or one a head) is handed over as it is, with no copy."""
    generator = torch.Generator().manual_seed(kv_heads)
    mask = torch.rand(2, kv_heads, 4, 5, generator=generator) < 0.5
    repeated = per_query_head(mask, 6)
    if kv_heads in (1, 6):
        assert repeated is mask
    else:
        assert repeated.shape == (2, 6, 4, 5)
        for h in range(6):
            assert torch.equal(repeated[:, h], mask[:, h // (6 // kv_heads)])


@pytest.mark.parametrize("offset, length, keys, window, sinks", [
    (0, 1, 1, None, 0), (0, 5, 5, None, 0), (7, 3, 10, None, 0), (9, 1, 10, None, 0),
    (7, 3, 10, 3, 0), (7, 3, 10, 3, 2), (7, 3, 8, 4, 0),  # the last: keys 2..9, the first two already let go
])
@pytest.mark.parametrize("heads, kv_heads", [(4, 1), (4, 2), (4, 4)])
def test_attention_scores_of_contiguous_keys_match_the_explicit_softmax(offset, length, keys, window, sinks, heads,
                                                                         kv_heads):
    q, k, _ = tensors(offset * 100 + length * 10 + keys, 2, heads, kv_heads, length, keys)
    visible = visible_keys(2, kv_heads, length, keys, offset, window, sinks=sinks)
    assert_scores(q, k, visible, offset=offset, window=window, sinks=sinks)


def test_attention_scores_with_key_positions_in_any_order_match_the_explicit_softmax():
    """A ring in slot order with two sinks, then the chunk of two queries: positions say who is who."""
    q, k, _ = tensors(1, 2, 4, 2, 2, 8)
    kept = torch.tensor([0, 1, 8, 9, 6, 7, 10, 11])
    for window, sinks in ((None, 0), (4, 2), (4, 0)):
        assert_scores(q, k, visible_keys(2, 2, 2, 8, 10, window, kept, sinks), offset=10, window=window,
                      key_positions=kept, sinks=sinks)


def per_head_positions():
    """(B=2, KVH=2, S=6): each row's KV heads keep their own three earlier positions, then the chunk 6, 7, 8."""
    earlier = torch.tensor([[[0, 2, 5], [1, 3, 4]], [[5, 4, 0], [2, 1, 3]]])
    return torch.cat((earlier, torch.arange(6, 9).expand(2, 2, 3)), dim=-1)


def test_attention_scores_with_each_kv_heads_own_positions_match_the_explicit_softmax():
    q, k, _ = tensors(2, 2, 4, 2, 3, 6)
    positions = per_head_positions()
    assert_scores(q, k, visible_keys(2, 2, 3, 6, 6, key_positions=positions), offset=6, key_positions=positions)


@pytest.mark.parametrize("mask_heads", [1, 2])
def test_attention_scores_under_a_key_mask_match_the_explicit_softmax(mask_heads):
    """A key mask (B, 1, L, S) or (B, KVH, L, S) replaces offset and positions; each row keeps its last key."""
    q, k, _ = tensors(3, 3, 4, 2, 2, 5)
    key_mask = torch.rand(3, mask_heads, 2, 5, generator=torch.Generator().manual_seed(mask_heads)) < 0.5
    key_mask[..., -1] = True
    assert_scores(q, k, key_mask, offset=0, key_mask=key_mask)


def test_attention_scores_queries_are_the_queries_and_other_summaries_are_refused():
    q, k, _ = tensors(4, 1, 4, 2, 2, 3)
    assert attention_scores(q, k, offset=1, summary="queries") is q
    with pytest.raises(ValueError, match=r"one of \['summed', 'weights', 'queries'\], got 'rows'"):
        attention_scores(q, k, offset=1, summary="rows")


def test_a_chunk_over_each_kv_heads_own_positions_matches_the_explicit_reference():
    """An evicting kind's chunk after eviction: three queries (not the four heads) over each KV head's kept keys."""
    q, k, v = tensors(5, 2, 4, 2, 3, 6)
    visible = visible_keys(2, 2, 3, 6, 6, key_positions=per_head_positions())
    expected = reference_output(reference_weights(q, k, visible), v)
    got = causal_attention(q, k, v, offset=6, key_positions=per_head_positions())
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4)])
def test_decode_rows_at_their_own_key_lengths_each_match_their_own_reference(heads, kv_heads):
    """Three rows of 5, 2 and 4 keys padded to 5 (the padding random too): each row attends to its own keys."""
    q, k, v = tensors(6, 3, heads, kv_heads, 1, 5)
    lengths = (5, 2, 4)
    key_mask = torch.tensor([[slot < n for slot in range(5)] for n in lengths]).view(3, 1, 1, 5)
    got = causal_attention(q, k, v, offset=0, key_mask=key_mask, key_lengths=lengths)
    assert got.shape == q.shape
    for b, n in enumerate(lengths):
        row = (q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n])
        expected = reference_output(reference_weights(row[0], row[1], torch.ones(1, 1, 1, n, dtype=torch.bool)), row[2])
        torch.testing.assert_close(got[b : b + 1], expected, atol=1e-12, rtol=1e-12)


def test_an_evicting_step_sees_every_key_it_kept_without_a_window():
    """One query at position 9 over the kept keys in any order, shared or each KV head's own."""
    q, k, v = tensors(7, 2, 4, 2, 1, 5)
    for kept in (torch.tensor([9, 2, 5, 0, 7]), torch.tensor([[[9, 2, 5, 0, 7], [1, 9, 3, 8, 6]]]).expand(2, 2, 5)):
        expected = reference_output(reference_weights(q, k, visible_keys(2, 2, 1, 5, 9, key_positions=kept)), v)
        torch.testing.assert_close(causal_attention(q, k, v, offset=9, key_positions=kept), expected,
                                   atol=1e-12, rtol=1e-12)


def test_an_evicting_step_under_a_window_hides_the_kept_keys_outside_it():
    """Kept positions 1 and 4 lie outside the window of 4 at position 9: one query must not see them."""
    q, k, v = tensors(8, 2, 4, 2, 1, 5)
    kept = torch.tensor([1, 8, 4, 6, 9])
    for sinks in (0, 2):
        visible = visible_keys(2, 2, 1, 5, 9, window=4, key_positions=kept, sinks=sinks)
        assert not visible.all()
        expected = reference_output(reference_weights(q, k, visible), v)
        got = causal_attention(q, k, v, offset=9, window=4, key_positions=kept, sinks=sinks)
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
