import math

import pytest
import torch

from kvbench.attention import causal_attention, causal_mask, visibility


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
