"""The ring's blocks on flash-attn's kernel: one block's forward with its log-sum-exp, and
when that kernel is used.

A block of the ring needs (out, lse) to be merged (block_attention.py). flash-attn 2's public
functions return the lse when asked, `return_attn_probs=True` (without dropout the probabilities
themselves are an empty tensor):

    flash_attn_func         q [B, Tq, H, D], k/v [B, Tk, KV, D]    lse fp32 [B, H, Tq]
    flash_attn_varlen_func  q [total_q, H, D], k/v [total_k, ...]   lse fp32 [H, total_q]
                            (before 2.6: per sequence, padded, [n, H, max_seqlen_q])

and a row that sees no key gets lse = +inf (the kernel's `normalize_softmax_lse`), not the
-inf the merge rule needs: the calls below never include such a row.

Which call for which block (the ring's Step 2 table, ring_attention.py):

    diagonal, unpadded          flash_attn_func, causal: the rank's two chunks end to end are
                                in sequence order, so causal in that order is causal
    off the diagonal, unpadded  flash_attn_func, not causal: the ring computes only the part
                                of the block where every pair is allowed
    padded or packed            flash_attn_varlen_func, one sequence per (row, sample) that has
                                both queries and keys in the block; causal on the diagonal
                                (there a sample's queries and keys are the same tokens); on the
                                diagonal a padding token is a sequence of its own (it sees
                                itself only, as `allowed_pairs` says); a query whose sample has
                                no key in the block is left out (out 0, lse -inf: merged with
                                weight 0)

Worked example, C = 2, S = 8, one packed row with sample ids [1 1 1 2 2 2 0 0]: rank 1 holds
positions [2 3 4 5], ids [1 2 2 2]. Its block from rank 0 (my queries x rank 0's head chunk,
positions [0 1], ids [1 1]) has one sequence, sample 1: query position 2 and keys 0, 1, so
cu_seqlens_q [0 1], cu_seqlens_k [0 2]; sample 2 has no key there and is left out. Rank 0's
diagonal (positions [0 1 6 7], ids [1 1 0 0]) has sample 1 (tokens 0, 1) and the two padding
tokens alone: cu_seqlens_q = cu_seqlens_k = [0 2 3 4], causal.

The backward stays ours (block_attention.block_grads, in fp32, from this forward's lse).
flash-attn's backward that takes an outside out and lse (as a ring's blocks must: each
block's share of the *merged* softmax) is the private `_flash_attn_backward`, whose signature
changed in 2.6 (softcap) and again in 2.7 (window_size split in two); the public functions'
autograd would differentiate each block's own softmax and drop the gradient that reaches its
lse through the merge.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from parallel.context_parallel.block_attention import BlockMask
from utils.gpu_libraries import OptionalImport, flash_attn_problem, import_flash_attn


@dataclass(frozen=True)
class FlashKernels:
    func: OptionalImport
    varlen_func: OptionalImport


def find_flash_kernels() -> FlashKernels:
    """flash-attn >= 2.1's two attention functions, or why not (once at import; the tests
    re-run it on the emulated library)."""
    return FlashKernels(import_flash_attn("flash_attn_func"),
                        import_flash_attn("flash_attn_varlen_func"))


flash_kernels = find_flash_kernels()


def why_not_flash_blocks(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """'' if the ring's blocks run on flash-attn for these activations, else why not."""
    return (flash_kernels.func.missing_reason or flash_kernels.varlen_func.missing_reason
            or flash_attn_problem(device, dtype, head_dim))


def ring_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The ring's block kernel, for a run's kernel line: which one, and why not flash-attn."""
    reason = why_not_flash_blocks(device, dtype, head_dim)
    if reason:
        return f"ring (context parallel; plain matmul/softmax blocks in fp32: {reason})"
    return "ring (context parallel; flash-attn block forwards, plain backward in fp32)"


def flash_attend_block(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       mask: BlockMask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_attention.attend_block` on flash-attn: (out [B, Tq, H, D], lse fp32 [B, Tq, H])
    of `query` on one block of keys/values ([B, Tk, KV, D]; bf16/fp16), the pairs `mask`
    allows (module docstring's table)."""
    if mask.query_ids is None:
        out, lse, _ = flash_kernels.func.value(query, key, value, softmax_scale=scale,
                                               causal=mask.diagonal, return_attn_probs=True)
        return out, lse.transpose(1, 2)
    out = query.new_zeros(query.shape)
    lse = query.new_full(query.shape[:3], float("-inf"), dtype=torch.float32)
    packed = _pack_sequences(mask)
    if packed is None:  # no sample has both queries and keys here
        return out, lse
    query_at, key_at, cu_seqlens_q, cu_seqlens_k = packed
    packed_out, packed_lse, _ = flash_kernels.varlen_func.value(
        query[query_at], key[key_at], value[key_at], cu_seqlens_q, cu_seqlens_k,
        int(cu_seqlens_q.diff().max()), int(cu_seqlens_k.diff().max()), softmax_scale=scale,
        causal=mask.diagonal, return_attn_probs=True)
    out[query_at] = packed_out
    lse[query_at] = _unpadded_lse(packed_lse, cu_seqlens_q).T
    return out, lse


def _sequence_labels(ids: torch.Tensor, diagonal: bool, stride: int) -> torch.Tensor:
    """Each token's varlen sequence, [B, T]: b * stride + its sample id in row b; on the
    diagonal a padding token (id 0) is alone, b * stride + stride/2 + its column; elsewhere
    padding is in none (-1)."""
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None] * stride
    if not diagonal:
        return torch.where(ids > 0, rows + ids, -1)
    columns = torch.arange(ids.shape[1], device=ids.device)[None, :]
    return rows + torch.where(ids > 0, ids, stride // 2 + columns)


def _pack_sequences(mask: BlockMask
                    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor],
                               torch.Tensor, torch.Tensor] | None:
    """((rows, columns) of the queries, the same of the keys, cu_seqlens_q, cu_seqlens_k) of
    the block's sequences packed end to end, the i-th sequence of the queries the i-th of the
    keys; None when there is none."""
    stride = 2 * (int(max(mask.query_ids.max(), mask.key_ids.max())) + 1
                  + mask.query_ids.shape[1])
    labels = [_sequence_labels(ids, mask.diagonal, stride)
              for ids in (mask.query_ids, mask.key_ids)]
    counts = [torch.bincount(label[label >= 0], minlength=mask.query_ids.shape[0] * stride)
              for label in labels]
    shared = (counts[0] > 0) & (counts[1] > 0)  # sequences with both queries and keys
    if not shared.any():
        return None
    packed = []
    for label, count in zip(labels, counts):
        kept = (label >= 0) & shared[label.clamp(min=0)]
        rows, columns = kept.nonzero(as_tuple=True)
        order = label[rows, columns].argsort(stable=True)  # by sequence, in position order
        packed.append(((rows[order], columns[order]),
                       F.pad(count[shared].cumsum(dim=0), (1, 0)).to(torch.int32)))
    (query_at, cu_seqlens_q), (key_at, cu_seqlens_k) = packed
    return query_at, key_at, cu_seqlens_q, cu_seqlens_k


def _unpadded_lse(lse: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The varlen lse as [H, total_q], from either layout (module docstring)."""
    if lse.dim() == 2:
        return lse
    lengths = cu_seqlens.diff().tolist()
    return torch.cat([lse[index, :, :length] for index, length in enumerate(lengths)], dim=1)
