"""Causal attention with an offset-aware rectangular mask, and an optional sliding window.

Both decoding paths call :func:`causal_attention`: the full-prefix path with
``offset = 0`` and every position as a query, the cached path with the cached
prefix length as ``offset`` and only the new positions as queries. Visibility is
defined on absolute positions: the query at position p sees keys 0..p, or with a
window W only keys p-W+1..p, and with K attention sinks (StreamingLLM) also keys 0..K-1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(offset: int, length: int, device: torch.device | None = None) -> Tensor:
    """Boolean visibility [length, offset + length]: True where a query may attend.

    Row i is the query at absolute position ``offset + i``; column j is the key at
    absolute position j. A top-left triangle over this rectangle would be wrong:
    it would hide most of the prefix from the first new query.
    """
    return visibility(torch.arange(offset, offset + length, device=device), torch.arange(offset + length, device=device),
                      window=None)


def visibility(query_positions: Tensor, key_positions: Tensor, window: int | None, sinks: int = 0) -> Tensor:
    """Boolean [..., queries, keys] from absolute positions: key k is visible to query q when
    k <= q, and with a window W also k > q - W or, with K sinks, k < K. Keys (S,) give (L, S); keys
    (B, KVH, S), each key/value head's own kept positions (an evicting kind's top-k per head), give (B, KVH, L, S)."""
    keys = key_positions[..., None, :]
    seen = keys <= query_positions[:, None]
    if window is not None:
        seen &= (keys > query_positions[:, None] - window) | (keys < sinks)
    return seen


SUMMED, WEIGHTS, QUERIES = "summed", "weights", "queries"
SCORES = (SUMMED, WEIGHTS, QUERIES)  # what a cache's wants_scores may ask for


def per_query_head(mask: Tensor, heads: int) -> Tensor:
    """A (B, KVH, L, S) mask of each key/value head as SDPA reads it: one row of heads per query head."""
    return mask if mask.shape[1] in (1, heads) else mask.repeat_interleave(heads // mask.shape[1], dim=1)


def attention_scores(q: Tensor, k: Tensor, offset: int, window: int | None = None, key_positions: Tensor | None = None,
                     key_mask: Tensor | None = None, sinks: int = 0, summary: str = SUMMED) -> Tensor:
    """The softmax weights the new queries give the keys causal_attention saw (same arguments, same mask).

    summary "summed": (B, KVH, S), each key's weight summed over the new queries and the query heads that
    share its key/value head (H2O's accumulated attention, TOVA's last row when L = 1); "weights": every
    weight, (B, H, L, S) (SnapKV pools its observation window's rows). A key no query sees weighs 0.
    "queries": the step's rotated queries q themselves, (B, H, L, D), for a kind that computes only the rows it
    needs (SnapKV's window of the last queries, as kvpress does): nothing is computed here.
    """
    if summary not in SCORES:
        raise ValueError(f"attention scores are one of {list(SCORES)}, got {summary!r}")
    if summary == QUERIES:
        return q
    B, H, L, D = q.shape
    KVH, S = k.shape[1], k.shape[2]
    if key_mask is not None:
        mask = key_mask[:, :, None]  # (B, 1 or KVH, 1, L, S)
    elif key_positions is not None and key_positions.dim() == 3:  # one set of kept positions per KV head
        mask = visibility(torch.arange(offset, offset + L, device=q.device), key_positions, None)[:, :, None]
    else:
        keys = torch.arange(offset + L - S, offset + L, device=q.device) if key_positions is None else key_positions
        mask = visibility(torch.arange(offset, offset + L, device=q.device), keys, window, sinks)  # (L, S)
    logits = torch.einsum("bkgld,bksd->bkgls", q.reshape(B, KVH, H // KVH, L, D), k) * D**-0.5
    weights = logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # (B, KVH, H / KVH, L, S)
    if summary == WEIGHTS:
        return weights.reshape(B, H, L, S)
    return weights.sum(dim=(2, 3))


def one_query(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """One new position attending to every key. Under grouped-query attention the query heads that share a
    key/value head become that head's queries (B, KVH, H / KVH, D): one plain attention call, about twice as
    fast on the CPU as SDPA's enable_gqa for a single query, with no mask (each of them sees every key)."""
    B, H, _, D = q.shape
    KVH = k.shape[1]
    if H == KVH:
        return F.scaled_dot_product_attention(q, k, v)
    return F.scaled_dot_product_attention(q.reshape(B, KVH, H // KVH, D), k, v).view(B, H, 1, D)


def batched_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, key_lengths: tuple[int, ...] | None) -> Tensor:
    """causal_attention of a batch of requests at their own lengths (its key_mask and key_lengths)."""
    B, H, L, D = q.shape
    KVH = k.shape[1]
    if L == 1 and key_lengths is not None:  # decode rows, each over its own keys: no padding, no mask
        return torch.cat([one_query(q[b : b + 1], k[b : b + 1, :, :T], v[b : b + 1, :, :T])
                          for b, T in enumerate(key_lengths)])
    if L == 1 and H != KVH:  # decode rows: fold the query heads onto their shared KV head, as one_query does
        folded = q.reshape(B, KVH, H // KVH, D)
        return F.scaled_dot_product_attention(folded, k, v, attn_mask=key_mask).view(B, H, 1, D)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=per_query_head(key_mask, H), enable_gqa=H != KVH)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, offset: int, window: int | None = None,
                     key_positions: Tensor | None = None, key_mask: Tensor | None = None, sinks: int = 0,
                     key_lengths: tuple[int, ...] | None = None) -> Tensor:
    """Attend new queries to the keys they may see.

    q: (B, H, L, D) queries at absolute positions offset..offset+L-1
    k, v: (B, KVH, S, D), with H % KVH == 0 (grouped-query attention shares each KV head):
          without key_positions, the contiguous positions offset+L-S..offset+L-1 (S = offset + L
          unless a window lets the earliest go); with key_positions (S,), those positions in any order,
          or (B, KVH, S), each key/value head's own kept positions (an evicting kind's top-k per head)
    window: None (every earlier key is visible) or W (only the last W positions)
    key_mask: None, or (B, 1, L, S) visibility row by row (a batch of requests at their own lengths,
          padded to the longest: kvbench.cache.batch), which then replaces offset and positions; (B, KVH, L, S)
          where each key/value head keeps its own positions
    sinks: with a window, the first K positions stay visible to every query too (StreamingLLM's attention sinks)
    key_lengths: with key_mask, when row b's keys are its positions 0..T_b-1 (the first T_b of S): for one query a
          row (a decode step) each row then attends to its own T_b keys alone, one call a row, rather than the
          padded (B, S) rectangle: rows of a few hundred positions padded to the longest of a batch made SDPA's
          share of the step three times their keys' (scripts/row_cost.py)
    returns (B, H, L, D)
    """
    if key_mask is not None:
        if window is not None:
            raise ValueError(f"a batch of requests at their own lengths needs full attention, got window {window}")
        return batched_attention(q, k, v, key_mask, key_lengths)
    length, key_length = q.shape[-2], k.shape[-2]
    grouped = q.shape[1] != k.shape[1]
    if key_positions is not None and length == 1 and window is None:  # an evicting kind's step: every key kept is older
        return one_query(q, k, v)
    if key_positions is None:  # contiguous keys: check them, drop what no query sees, take a shortcut if one fits
        start = offset + length - key_length  # absolute position of the first key
        if start < 0 or (start > 0 and window is None):
            raise ValueError(
                f"attention expects offset + queries = keys; got offset {offset} + {length} queries but {key_length} keys"
            )
        sink_keys, sinks_start = 0, start
        if window is not None and offset - window + 1 > start:  # keys no query can see: leave them out
            first = offset - window + 1
            sink_keys = max(0, min(sinks, first) - start)  # but not the sinks among them: every query sees 0..K-1
            if sink_keys:
                k, v = (torch.cat((t[:, :, :sink_keys], t[:, :, first - start :]), dim=2) for t in (k, v))
            else:
                k, v = k[:, :, first - start :], v[:, :, first - start :]
            start = first
        # Chosen by shape, so that the one-token decode step never builds a mask over the whole prefix.
        if length == 1:  # the newest query sees every key left
            return one_query(q, k, v)
        if offset == 0 and (window is None or length <= window):  # square: the ordinary lower triangle
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        key_positions = torch.arange(start, offset + length, device=q.device)
        if sink_keys:
            key_positions = torch.cat((torch.arange(sinks_start, sinks_start + sink_keys, device=q.device), key_positions))
    queries = torch.arange(offset, offset + length, device=q.device)
    if key_positions.dim() == 3:  # each KV head its own kept positions (an evicting kind's chunk after eviction)
        mask = per_query_head(visibility(queries, key_positions, None), q.shape[1])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
    mask = visibility(queries, key_positions, window, sinks)  # a ring's keys in any order, or a rectangle or band
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
