"""Attention of some queries on one block of keys, with its log-sum-exp, and the rule that
merges such partial results: the arithmetic of ring attention, without the communication.

For query q and the keys k_j of one block, with scores s_j = q.k_j / sqrt(d):

    lse   = log sum_j exp(s_j)                    (-inf if the block has no allowed key)
    out   = sum_j exp(s_j - lse) v_j              (0 then)

Two blocks A and B of the same query merge exactly into attention over A and B together:

    lse   = log(exp(lse_A) + exp(lse_B))
    out   = exp(lse_A - lse) out_A + exp(lse_B - lse) out_B

(each partial softmax is rescaled to the common denominator; the online softmax of
Milakov & Gimelshein 2018, as flash attention uses it). The backward of one block needs only
the final lse and out of the whole row (Dao et al. 2022): with P = exp(S - lse), the block's
share of the global softmax,

    dV = P^T dO      dS = P * (dO V^T - rowsum(dO * O))      dQ = dS K / sqrt(d)
    dK = dS^T Q / sqrt(d)

GQA: queries are viewed as [B, T, KV, G, D] (G = H / KV query heads per key/value head), so
key/value keep their KV heads, and dK/dV sum over each group. Masks are bool [B or 1, Tq, Tk],
True = may attend, the rule of `model.attention.attention_mask_for`.

Memory: the scores of a block exist for `query_tile` queries at a time ([B, H, tile, Tk] and
a few temporaries of that size), as flash attention tiles its queries: every row's softmax
needs all of the block's keys but no other row, so tiles are independent. Without it one
block of S/C queries x S/C keys (fp32, every head) would cost more memory than context
parallelism saves on the other activations (bench/bench_parallel.py --context).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def allowed_pairs(query_pos: torch.Tensor, key_pos: torch.Tensor,
                  query_ids: torch.Tensor | None, key_ids: torch.Tensor | None
                  ) -> torch.Tensor:
    """Who may attend to whom in one block, from the tokens' positions in the whole sequence
    ([Tq], [Tk]) and their sample ids ([B, Tq], [B, Tk]: 0 = padding, else the sample's
    number; None = one unpadded sample). Causal; within a sample only; a padding query sees
    itself only (so its softmax row is never empty). Returns bool [B or 1, Tq, Tk]."""
    causal = key_pos[None, :] <= query_pos[:, None]
    if query_ids is None:
        return causal[None]
    is_self = key_pos[None, :] == query_pos[:, None]
    same_sample = (key_ids[:, None, :] == query_ids[:, :, None]) & (key_ids[:, None, :] > 0)
    return causal & (same_sample | is_self)


@dataclass(frozen=True)
class BlockMask:
    """Who may attend to whom in one block of the ring, in the terms of either kernel: the
    plain path takes the boolean mask (`allowed`), flash-attn a causal flag and the sample ids
    (flash_blocks.py). `diagonal`: the block is the rank's own tokens, so the mask is causal in
    the order the rank holds them (its two chunks end to end are in sequence order); any other
    block the ring computes is allowed whole, up to the sample rule."""
    diagonal: bool
    query_pos: torch.Tensor          # [Tq] positions in the whole sequence
    key_pos: torch.Tensor            # [Tk]
    query_ids: torch.Tensor | None   # [B, Tq] sample ids; None = one unpadded sample per row
    key_ids: torch.Tensor | None     # [B, Tk]

    def allowed(self) -> torch.Tensor | None:
        """`allowed_pairs` of the block, or None when every pair may attend."""
        if self.query_ids is None and not self.diagonal:
            return None
        return allowed_pairs(self.query_pos, self.key_pos, self.query_ids, self.key_ids)


def _grouped(query: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, T, H, D] -> [B, T, KV, G, D]: query head h reads key/value head h // G."""
    batch, seq, heads, dim = query.shape
    return query.view(batch, seq, num_kv_heads, heads // num_kv_heads, dim)


def _scores(query: torch.Tensor, key: torch.Tensor, allowed: torch.Tensor | None,
            scale: float) -> torch.Tensor:
    """Masked scores [B, KV, G, Tq, Tk] (-inf where not allowed)."""
    scores = torch.einsum("btkgd,bskd->bkgts", _grouped(query, key.shape[2]), key) * scale
    if allowed is None:
        return scores
    return scores.masked_fill(~allowed[:, None, None], float("-inf"))


def _per_row(values: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """One value per query row and head, [B, T, H] -> [B, KV, G, T, 1], to broadcast against
    the scores."""
    batch, seq, heads = values.shape
    grouped = values.view(batch, seq, num_kv_heads, heads // num_kv_heads)
    return grouped.permute(0, 2, 3, 1)[..., None]


QUERY_TILE = 256
"""Queries whose scores exist at once (module docstring, Memory): 256 x 2048 keys x 32 heads
in fp32 is 64 MiB."""


def _query_tiles(num_queries: int, query_tile: int) -> list[slice]:
    return [slice(start, start + query_tile) for start in range(0, num_queries, query_tile)]


def _rows(allowed: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if allowed is None else allowed[:, rows]


def attend_block(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 allowed: torch.Tensor | None, scale: float, query_tile: int = QUERY_TILE
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Tq, H, D], lse [B, Tq, H]) of `query` on one block of keys/values
    ([B, Tk, KV, D]); allowed None = every pair. A row with no allowed key gets lse = -inf and
    out = 0, which the merge rule weighs by exp(-inf) = 0. Computed `query_tile` rows at a
    time."""
    tiles = [_attend_tile(query[:, rows], key, value, _rows(allowed, rows), scale)
             for rows in _query_tiles(query.shape[1], query_tile)]
    return torch.cat([out for out, _ in tiles], dim=1), torch.cat([lse for _, lse in tiles], dim=1)


def _attend_tile(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 allowed: torch.Tensor | None, scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _scores(query, key, allowed, scale)
    lse = scores.logsumexp(dim=-1, keepdim=True)  # [B, KV, G, Tq, 1]
    probs = torch.exp(scores - torch.where(lse.isinf(), 0.0, lse))  # exp(-inf - 0) = 0
    out = torch.einsum("bkgts,bskd->btkgd", probs, value).flatten(2, 3)
    return out, lse[..., 0].permute(0, 3, 1, 2).flatten(2)


def merge_into(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
               block_lse: torch.Tensor) -> None:
    """The merge rule, in place on the running (out, lse); the running lse must be finite
    (the ring starts with the diagonal block, where every query sees at least itself)."""
    new_lse = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new_lse)[..., None]).add_(
        block_out * torch.exp(block_lse - new_lse)[..., None])
    lse.copy_(new_lse)


def block_grads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                allowed: torch.Tensor | None, scale: float, lse: torch.Tensor,
                grad_out: torch.Tensor, delta: torch.Tensor, query_tile: int = QUERY_TILE
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This block's share of (dQ [B, Tq, H, D], dK, dV [B, Tk, KV, D]), from the final lse
    [B, Tq, H] of the rows and delta = rowsum(dO * O) [B, Tq, H]; `query_tile` rows at a
    time: dQ of each tile is its own, dK and dV add every tile's share."""
    grad_query = torch.empty_like(query)
    grad_key, grad_value = torch.zeros_like(key), torch.zeros_like(value)
    for rows in _query_tiles(query.shape[1], query_tile):
        tile_grads = _tile_grads(query[:, rows], key, value, _rows(allowed, rows), scale,
                                 lse[:, rows], grad_out[:, rows], delta[:, rows])
        grad_query[:, rows] = tile_grads[0]
        grad_key += tile_grads[1]
        grad_value += tile_grads[2]
    return grad_query, grad_key, grad_value


def _tile_grads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                allowed: torch.Tensor | None, scale: float, lse: torch.Tensor,
                grad_out: torch.Tensor, delta: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_kv_heads = key.shape[2]
    probs = torch.exp(_scores(query, key, allowed, scale) - _per_row(lse, num_kv_heads))
    grad_out_grouped = _grouped(grad_out, num_kv_heads)
    grad_value = torch.einsum("bkgts,btkgd->bskd", probs, grad_out_grouped)
    grad_probs = torch.einsum("btkgd,bskd->bkgts", grad_out_grouped, value)
    grad_scores = probs * (grad_probs - _per_row(delta, num_kv_heads)) * scale
    grad_query = torch.einsum("bkgts,bskd->btkgd", grad_scores, key).flatten(2, 3)
    grad_key = torch.einsum("bkgts,btkgd->bskd", grad_scores, _grouped(query, num_kv_heads))
    return grad_query, grad_key, grad_value
