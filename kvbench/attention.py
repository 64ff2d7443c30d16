"""Causal attention with an offset-aware rectangular mask.

Both decoding paths call :func:`causal_attention`: the full-prefix path with
``offset = 0`` and every position as a query, the cached path with the cached
prefix length as ``offset`` and only the new positions as queries. Visibility is
defined on absolute positions: the query at position p sees keys 0..p.
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
    query_positions = torch.arange(offset, offset + length, device=device)
    key_positions = torch.arange(offset + length, device=device)
    return key_positions[None, :] <= query_positions[:, None]


def causal_attention(q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
    """Attend new queries to the prefix plus themselves.

    q: (B, H, L, D) queries at absolute positions offset..offset+L-1
    k, v: (B, KVH, offset + L, D) keys and values for positions 0..offset+L-1,
          with H % KVH == 0 (grouped-query attention shares each KV head)
    returns (B, H, L, D)
    """
    length, key_length = q.shape[-2], k.shape[-2]
    if key_length != offset + length:
        raise ValueError(
            f"attention expects offset + queries = keys; got offset {offset} + "
            f"{length} queries but {key_length} keys"
        )
    grouped = q.shape[1] != k.shape[1]
    # The three cases below are the same mask, chosen by shape so that the
    # one-token decode step never builds a mask over the whole prefix.
    if length == 1:
        # The newest query sees every key: nothing to mask.
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=grouped)
    if offset == 0:
        # Square case: the rectangular mask is the ordinary lower triangle.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
    mask = causal_mask(offset, length, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
