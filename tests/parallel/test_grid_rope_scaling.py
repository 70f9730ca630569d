"""An HF Llama-3-style base (RoPE scaled, llama3 or linear) trains on a tensor/pipeline or
context-parallel grid exactly as in one process, and one process scores it as transformers does.

A stage that computed RoPE without `config.rope_scaling` would train another model than the
one its checkpoint describes, and so would a context-parallel rank that rotated its tokens by
their positions in its shard instead of in the whole sequence: the loss differs from the
first step.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from model.modeling_z2all import Z2allForCausalLM
from parallel.local_ranks import run_on_ranks
from tests.model.hf_llama_dirs import random_hf_dir
from tests.parallel.grid_helpers import (
    Grid,
    assert_grids_equal_single_process,
    micro_batches_of,
    train_grids,
)

# name: (RoPE variant of random_hf_dir, (world, tensor_parallel, pipeline_parallel,
# sequence_parallel, schedule, micro-batches[, context_parallel]): grid_helpers.Grid)
CASES = {
    "llama3_tp2": ("llama3", (2, 2, 1, False, "1f1b", 2)),
    "llama3_pp2": ("llama3", (2, 1, 2, False, "1f1b", 2)),
    "llama3_tp2xpp2": ("llama3", (4, 2, 2, True, "1f1b", 2)),
    "linear_pp2": ("linear", (2, 1, 2, False, "afab", 2)),
    "llama3_cp2": ("llama3", (2, 1, 1, False, "1f1b", 2, 2)),
}


def _step1_loss(model: torch.nn.Module, micro_batches: list[dict[str, torch.Tensor]]
                ) -> torch.Tensor:
    """Mean cross-entropy over the micro-batches from `model`'s logits (ours or transformers':
    both take `attention_mask=`). Our labels are already shifted, so they meet the logits as
    they are; padding is no target (transformers gives a padded query other keys and
    positions than we do, and no training set scores padding)."""
    losses = []
    for batch in micro_batches:
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"].masked_fill(batch["attention_mask"] == 0, -100)
        losses.append(F.cross_entropy(logits.flatten(0, 1), labels.flatten()))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("case", list(CASES))
def test_rope_scaled_hf_base_on_grid_equals_one_process(case, tmp_path):
    variant, grid = CASES[case]
    hf_model, hf_dir = random_hf_dir(tmp_path, variant)
    build_model = partial(Z2allForCausalLM.from_hf, hf_dir)
    results = run_on_ranks(train_grids, {case: grid}, build_model, world_size=Grid(*grid).world,
                           timeout=600)
    assert_grids_equal_single_process(results, {case: grid}, build_model)

    first_step = micro_batches_of(step=0, data_parallel=1,
                                  num_micro=Grid(*grid).micro_batches)[0]
    with torch.no_grad():
        torch.testing.assert_close(_step1_loss(build_model(), first_step),
                                   _step1_loss(hf_model, first_step), rtol=1e-5, atol=1e-6)
