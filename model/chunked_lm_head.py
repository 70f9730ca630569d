"""The output projection fused with the loss, computed a chunk of rows at a time.

Why: the logits are the largest activation of a small LLM. For batch 8 x 1024 tokens and a
32000-token vocabulary they are 262M numbers, 1 GiB in fp32, and a plain `F.cross_entropy`
keeps that (plus its softmax) alive until backward. Here at most `CHUNK_LOGIT_ELEMENTS`
logits exist at any time.

Loss (`linear_cross_entropy`): the gradient of a mean cross-entropy with respect to the
logits is known in closed form, (softmax(z) - onehot(y)) / n_valid, so each chunk's gradient
for `hidden` and `weight` is computed right after its loss, in the forward pass, and backward
only scales them by the incoming scalar (the "fused linear cross-entropy" of the Liger-Kernel
paper, Hsu et al. 2024). Same matmul FLOPs as the unfused version, no recomputation.

Per-token log-probabilities (`linear_token_log_probs`, for DPO): the incoming gradient is a
different number per token, so the closed form cannot be applied in forward; each chunk is
instead checkpointed and its logits recomputed in backward (one extra matmul per chunk).

Both keep the softmax in fp32 whatever the matmul dtype. `LMHead` is the model's output
layer: an `nn.Linear` whose forward runs the plain projection or one of these two fused paths,
so that every read of its weight happens inside its own forward (see `LMHead`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from utils.labels import IGNORE_INDEX

CHUNK_LOGIT_ELEMENTS = 2**24
"""Logits per chunk: 16M fp32 numbers = 64 MiB (e.g. 512 rows of a 32768-token vocabulary)."""


def _rows_per_chunk(vocab_size: int) -> int:
    return max(1, CHUNK_LOGIT_ELEMENTS // vocab_size)


def _picked_log_probs(logits: torch.Tensor, labels: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 log-softmax of the logits [N, V], log p(label) [N] with 0 at ignored rows)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    picked = log_probs.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    return log_probs, picked.masked_fill(labels == IGNORE_INDEX, 0.0)


class _LinearCrossEntropy(torch.autograd.Function):
    """mean over valid rows of -log softmax(hidden @ weight^T)[label]; grads made in forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                compute_grads: bool) -> torch.Tensor:
        valid = labels != IGNORE_INDEX
        # An all-ignored batch (possible in SFT) gives loss 0 and zero grads, not 0/0 = NaN.
        inv_num_valid = 1.0 / valid.sum().clamp(min=1).float()
        row_mask = valid.to(hidden.dtype)[:, None]  # 0/1: exact in any dtype
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if compute_grads else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if compute_grads else None
        step = _rows_per_chunk(weight.shape[0])
        for start in range(0, hidden.shape[0], step):
            rows = slice(start, start + step)
            log_probs, picked = _picked_log_probs(hidden[rows] @ weight.T, labels[rows])
            loss_sum -= picked.sum()
            if compute_grads:
                # d(sum of losses)/d(logits) = softmax - onehot(label) on trained rows. The
                # row mask is applied to the narrow [rows, hidden] operands, not the wide
                # [rows, V] one. Every [rows, V] pass costs (memory-bound), so: exp in place
                # (log_probs is not needed any more; no new fp32 buffer), one cast to the
                # matmul dtype, and the -1 at each row's label as an indexed update
                # (scatter_add_ on bf16 converts the whole tensor to fp32 and back on CPU).
                grad_logits = log_probs.exp_().to(hidden.dtype)
                row_ids = torch.arange(grad_logits.shape[0], device=grad_logits.device)
                grad_logits[row_ids, labels[rows].clamp(min=0)] -= 1.0
                grad_hidden[rows] = (grad_logits @ weight) * row_mask[rows]
                grad_weight += (grad_logits.T @ (hidden[rows] * row_mask[rows])).float()
        ctx.save_for_backward(grad_hidden, grad_weight, inv_num_valid)
        return loss_sum * inv_num_valid

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight, inv_num_valid = ctx.saved_tensors
        scale = grad_loss.float() * inv_num_valid  # the mean's 1/n, applied once, in fp32
        dtype = grad_hidden.dtype  # = weight's dtype: both were cast to the matmul dtype
        return ((grad_hidden.float() * scale).to(dtype), (grad_weight * scale).to(dtype),
                None, None)


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype `hidden @ weight.T` would run in here, autocast included."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
                         ) -> torch.Tensor:
    """Mean cross-entropy of logits = hidden @ weight^T against labels (-100 ignored).

    hidden [N, hidden_size]; weight [vocab, hidden_size]; labels [N]. Returns an fp32 scalar.
    """
    dtype = _matmul_dtype(hidden, weight)
    # Casts happen outside the Function so autograd routes the grads back to the original
    # dtypes (e.g. an fp32 weight under bf16 autocast).
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    compute_grads = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(hidden.device.type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, labels, compute_grads)


def linear_token_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
                           ) -> torch.Tensor:
    """log softmax(hidden @ weight^T)[label] per row (0 where label == -100), fp32 [N]."""
    dtype = _matmul_dtype(hidden, weight)
    hidden, weight = hidden.to(dtype), weight.to(dtype)

    def chunk_log_probs(hidden_chunk: torch.Tensor, labels_chunk: torch.Tensor) -> torch.Tensor:
        return _picked_log_probs(hidden_chunk @ weight.T, labels_chunk)[1]

    step = _rows_per_chunk(weight.shape[0])
    chunks = []
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, hidden.shape[0], step):
            rows = slice(start, start + step)
            chunks.append(checkpoint(chunk_log_probs, hidden[rows], labels[rows],
                                     use_reentrant=False))
    return torch.cat(chunks)


class LMHead(nn.Linear):
    """The output projection hidden -> vocabulary (`lm_head.weight`, HF's name and shape).

    forward(hidden) gives logits; forward(hidden, labels) the fused mean loss;
    forward(hidden, labels, per_token=True) the per-token log-probs. The fused paths go through
    this forward too instead of reading `lm_head.weight` from outside: code that hooks modules
    relies on a parameter being used only inside its own module's forward (ZeRO-1's
    overlapped all-gather waits for a parameter in that module's forward pre-hook; reading the
    weight elsewhere could see it half-gathered).
    """

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__(hidden_size, vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor | None = None,
                per_token: bool = False) -> torch.Tensor:
        """hidden [N, hidden_size] (or [..., hidden_size] for logits); labels [N]."""
        if labels is None:
            return super().forward(hidden)
        if per_token:
            return linear_token_log_probs(hidden, self.weight, labels)
        return linear_cross_entropy(hidden, self.weight, labels)
