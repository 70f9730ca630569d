"""Cross-entropy over a vocabulary split across the tensor-parallel ranks, without ever
gathering the logits (Megatron-LM's vocab-parallel loss).

Rank r holds logits z[:, v] for its vocabulary slice v in [start, start + V/T). The loss of a
token with label y is log(sum_v exp z_v) - z_y, computed with three all-reduces of [N]-sized
vectors instead of one gather of [N, V]:

    Step 1  m   = max over all ranks of the local row maxima      (all-reduce MAX; stability)
    Step 2  s   = sum over all ranks of sum_v exp(z_v - m)        (all-reduce SUM)
    Step 3  z_y = the label's logit, from the one rank that has y (all-reduce SUM of 0s and it)
            loss = log s - (z_y - m)

Backward: d loss / d z_v = softmax_v - [v == y], each rank for its own slice, no communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from utils.labels import IGNORE_INDEX


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, labels, vocab_start, group):
        logits = local_logits.float()
        local_vocab = logits.shape[-1]
        # Step 1: the global row max.
        row_max = logits.max(dim=-1).values
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - row_max[:, None]
        # Step 2: the global sum of exponentials.
        exp_logits = shifted.exp()
        sum_exp = exp_logits.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        # Step 3: the label's logit, contributed by the rank whose slice holds it.
        local_labels = labels - vocab_start
        here = (local_labels >= 0) & (local_labels < local_vocab)
        local_labels = local_labels.masked_fill(~here, 0)
        label_logit = shifted.gather(-1, local_labels[:, None])[:, 0] * here
        dist.all_reduce(label_logit, group=group)
        valid = labels != IGNORE_INDEX
        token_losses = (sum_exp.log() - label_logit) * valid
        softmax = exp_logits.div_(sum_exp[:, None])
        ctx.save_for_backward(softmax, local_labels, here, valid)
        ctx.logits_dtype = local_logits.dtype
        return token_losses

    @staticmethod
    def backward(ctx, grad_losses):
        softmax, local_labels, here, valid = ctx.saved_tensors
        grad = softmax  # reused in place: backward runs once
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_labels] -= here.float()
        grad *= (grad_losses * valid)[:, None]
        return grad.to(ctx.logits_dtype), None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, labels: torch.Tensor,
                                 vocab_start: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Per-token fp32 losses [N] (0 where labels == -100) from this rank's logits [N, V/T]."""
    return _VocabParallelCrossEntropy.apply(local_logits, labels, vocab_start, group)
