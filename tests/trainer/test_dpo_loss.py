"""DPO loss vs the closed-form formula, computed independently in float64 with plain math."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.dpo_loss import chosen_answer_nll_sum, dpo_loss, sequence_log_prob


def _reference(pc, pr, rc, rr, beta, eps):
    """Per-pair loss straight from the paper's formula with Python floats."""
    total = 0.0
    for a, b, c, d in zip(pc, pr, rc, rr):
        h = beta * ((a - c) - (b - d))
        # -log σ(h) = log(1 + e^(-h)); σ(-h) = 1 - σ(h)
        total += (1 - eps) * math.log1p(math.exp(-h)) + eps * math.log1p(math.exp(h))
    return total / len(pc)


@pytest.mark.parametrize("beta, eps", [(0.1, 0.0), (0.5, 0.0), (0.1, 0.2), (1.0, 0.05)])
def test_matches_closed_form(beta, eps):
    gen = torch.Generator().manual_seed(int(beta * 100 + eps * 1000))
    logps = [-(torch.rand(16, generator=gen, dtype=torch.float64) * 40) for _ in range(4)]
    out = dpo_loss(*logps, beta=beta, label_smoothing=eps)
    expected = _reference(*[t.tolist() for t in logps], beta, eps)
    assert out.loss.item() == pytest.approx(expected, rel=1e-10)
    pc, pr, rc, rr = logps
    torch.testing.assert_close(out.chosen_rewards, beta * (pc - rc))
    torch.testing.assert_close(out.rejected_rewards, beta * (pr - rr))


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_policy_equal_reference_gives_log2_and_zero_rewards(eps):
    chosen, rejected = -torch.rand(8) * 30, -torch.rand(8) * 30
    out = dpo_loss(chosen, rejected, chosen.clone(), rejected.clone(), beta=0.3,
                   label_smoothing=eps)
    assert out.loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert torch.count_nonzero(out.chosen_rewards) == 0
    assert torch.count_nonzero(out.rejected_rewards) == 0


def test_gradient_raises_chosen_and_lowers_rejected():
    chosen = (-torch.rand(4) * 10).requires_grad_()
    rejected = (-torch.rand(4) * 10).requires_grad_()
    dpo_loss(chosen, rejected, -torch.rand(4) * 10, -torch.rand(4) * 10).loss.backward()
    assert (chosen.grad < 0).all() and (rejected.grad > 0).all()


def test_sequence_log_prob_sums_answer_tokens():
    token_logps = -torch.rand(3, 7)
    token_logps[:, :2] = 0.0  # prompt positions carry 0 (label -100)
    torch.testing.assert_close(sequence_log_prob(token_logps),
                               torch.tensor([sum(row) for row in token_logps.tolist()]))


def test_rejects_bad_label_smoothing():
    x = torch.zeros(1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(x, x, x, x, label_smoothing=0.5)


def test_chosen_answer_nll_sum_is_summed_cross_entropy_over_trained_tokens():
    logits = torch.randn(3, 6, 11)
    labels = torch.randint(0, 11, (3, 6))
    labels[0, :2] = labels[2, 4:] = -100
    token_log_probs = torch.log_softmax(logits, -1).gather(
        -1, labels.clamp(min=0)[..., None])[..., 0] * (labels != -100)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1),
                                                 ignore_index=-100, reduction="sum")
    torch.testing.assert_close(chosen_answer_nll_sum(token_log_probs, labels), expected)
