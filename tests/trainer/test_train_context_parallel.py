"""`--context_parallel=2` from the command line on 2 gloo ranks: one data-parallel replica whose
two ranks each compute half of every sequence (parallel/context_parallel/context_shard.py).

One table, one row per task x feature; every row trains in one spawn of 2 ranks (a spawn costs
more than a run). Reference: the same command in one process (CP2 has one replica, so the same
--batch_size). Compared: every step's loss and gradient norm, the validation loss, the DPO
metrics and the final model.safetensors, to fp32 rounding (the ring merges attention blocks,
and the loss the two halves, in another order than one process). Rank 0 generates the eval
samples from the whole model, without the ring.

Resume (checkpoints hold whole weights; the data position is the one replica's): a run stopped
on CP2 resumes in one process, and one stopped in one process resumes on CP2, both continuing
the uninterrupted one-process run; stopped and resumed on CP2 it equals the uninterrupted CP2
run bitwise, and so after kill -9 of every rank under torchrun.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from parallel.local_ranks import run_on_ranks
from tests.parallel.grid_helpers import ADAM_EPS  # rounding noise not blown up to a whole lr
from tests.train_helpers import TINY_ARGS, data_args, records, run_main, train_losses
from tests.trainer.test_train_grid import _problems, _runs_on_rank, options_with
from tests.trainer.test_train_resume import _assert_identical
from tests.trainer.test_train_stream import finish, kill9_and_resume, torchrun
from trainer.option_validation import check_options

STEPS, STOP = 3, 2
CP2 = ["--context_parallel=2"]
DPO_METRICS = ("dpo_loss", "chosen_nll", "rewards/chosen", "rewards/rejected",
               "rewards/margins")
# name: (task, options of the run and of its one-process reference)
LAYOUTS = {
    "pretrain": ("pretrain", []),
    # ZeRO-1 shards over dp x cp (both ranks); recomputed blocks run the ring again
    "pretrain_zero1_recompute": ("pretrain", ["--zero_stage=1", "--activation_checkpointing"]),
    # ZeRO-3's units gathered and reduce-scattered over dp x cp around the ring's exchanges
    "pretrain_zero3": ("pretrain", ["--zero_stage=3"]),
    "sft_padded": ("sft", []),
    "sft_packed": ("sft", ["--pack_samples"]),  # samples cross the chunk boundaries
    "dpo": ("dpo", ["--dpo_nll_weight=0.2"]),
}
# name: (stopped with, resumed with, the uninterrupted reference run)
RESUMES = {"cp2_to_one": (CP2, ["--context_parallel=1"], "single_pretrain"),
           "one_to_cp2": ([], CP2, "single_pretrain"),
           "cp2_to_cp2": (CP2, CP2, "pretrain")}


def _args(data, task: str, root: Path, *extra: str) -> list[str]:
    init = [f"--init_from={root / 'init'}"] if task == "dpo" else []
    return [*TINY_ARGS, *data_args(data, task), *init, "--num_hidden_layers=2",
            "--gradient_accumulation_steps=2", f"--max_iters={STEPS}", "--eval_interval=2",
            "--save_interval=100", "--lr=1e-2", f"--adam_eps={ADAM_EPS}", "--dpo_beta=0.5",
            *extra]


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """Every row of both tables, on CP2 in one spawn and in one process (`single_<name>`)."""
    root = tmp_path_factory.mktemp("context_parallel")
    assert run_main([*_args(data, "pretrain", root, f"--out_dir={root / 'init'}"),
                     "--max_iters=2", "--eval_prompts=[]"]) == 0  # DPO's SFT stand-in
    for name, (task, options) in LAYOUTS.items():
        assert run_main(_args(data, task, root, *options, f"--out_dir={root / f'single_{name}'}")
                        ) == 0
    assert run_main(_args(data, "pretrain", root, f"--out_dir={root / 'one_to_cp2'}",
                          f"--stop_at_iter={STOP}")) == 0
    runs = [_args(data, task, root, *options, *CP2, f"--out_dir={root / name}")
            for name, (task, options) in LAYOUTS.items()]
    for name, (stopped_with, resumed_with, _) in RESUMES.items():
        out = f"--out_dir={root / name}"
        if stopped_with == CP2:
            runs.append(_args(data, "pretrain", root, *CP2, out, f"--stop_at_iter={STOP}"))
        if resumed_with == CP2:
            runs.append(_args(data, "pretrain", root, *CP2, out, "--resume"))
    assert run_on_ranks(_runs_on_rank, runs, world_size=2, timeout=900) == [[0] * len(runs)] * 2
    assert run_main(_args(data, "pretrain", root, "--context_parallel=1",
                          f"--out_dir={root / 'cp2_to_one'}", "--resume")) == 0
    return root


@pytest.mark.slow
def test_the_demo_model_on_2048_token_sequences_trains_like_one_process(data, tmp_path):
    """Issue #31's done-when, as a user runs it: `torchrun --nproc_per_node=2 train_my_ddp.py
    --context_parallel=2 --max_seq_len=2048` on the demo model (the `tiny` preset: 4 layers,
    GQA) equals the same command in one process, step by step (~40 s: `slow`, run beside the
    rest by `make test`)."""
    args = [*data_args(data, "pretrain"), "--model_preset=tiny", "--max_seq_len=2048",
            "--batch_size=1", "--gradient_accumulation_steps=2", f"--max_iters={STEPS}",
            "--eval_interval=3", "--eval_iters=1", "--eval_prompts=[]", "--log_interval=1",
            "--save_interval=100", "--dtype=fp32", "--num_threads=1", "--tracker=none"]
    finish(torchrun([*args, *CP2], tmp_path / "cp2"))
    assert run_main([*args, f"--out_dir={tmp_path / 'one'}"]) == 0
    _assert_trains_like(tmp_path / "cp2", tmp_path / "one")


def _assert_trains_like(run: Path, reference: Path, keys: tuple[str, ...] = ()) -> None:
    """Losses, gradient norms, `keys` of the train records, validation losses and the final
    weights of `run` equal `reference`'s to fp32 rounding."""
    assert len(train_losses(run)) == STEPS
    assert train_losses(run) == pytest.approx(train_losses(reference), rel=1e-5)
    for key in ("grad_norm", *keys):
        assert ([r[key] for r in records(run, "train")] == pytest.approx(
            [r[key] for r in records(reference, "train")], rel=1e-4, abs=1e-6)), key
    got, expected = ({r["step"]: r["val_loss"] for r in records(run_dir, "eval")}
                     for run_dir in (run, reference))
    assert {step: got[step] for step in expected} == pytest.approx(expected, rel=1e-5)
    final = Path("ckpt") / f"step_{STEPS:06d}" / "model.safetensors"
    saved, whole = load_file(run / final), load_file(reference / final)
    assert sorted(saved) == sorted(whole)
    for key in whole:  # a wrong or missing gradient moves a weight by about lr = 1e-2
        torch.testing.assert_close(saved[key], whole[key], rtol=1e-4, atol=1e-5,
                                   msg=lambda message, key=key: f"{run.name}: {key}: {message}")


@pytest.mark.parametrize("name", LAYOUTS)
def test_context_parallel_trains_like_one_process(trained, name):
    task = LAYOUTS[name][0]
    _assert_trains_like(trained / name, trained / f"single_{name}",
                        DPO_METRICS if task == "dpo" else ())
    if task == "dpo":  # the policy moved away from the reference: rewards are not all 0
        assert any(abs(r["rewards/margins"]) > 1e-4 for r in records(trained / name, "train"))
    else:  # generated on rank 0 from the whole model (no ring: the other rank generates none)
        assert records(trained / name, "samples")
    # the kernel line names the ring's block kernel and why not flash-attn (no GPU here)
    assert ("attention=ring (context parallel; plain matmul/softmax blocks in fp32: "
            in records(trained / name, "run")[0]["kernels"])


@pytest.mark.parametrize("name", RESUMES)
def test_context_parallel_run_resumes_on_another_layout(trained, name):
    reference = trained / RESUMES[name][2]
    assert [r["step"] for r in records(trained / name, "resume")] == [STOP]
    if reference.name == "pretrain":  # the same layout: bitwise
        _assert_identical(reference, trained / name, STEPS, STOP)
    else:
        _assert_trains_like(trained / name, reference)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks via /proc")
def test_kill9_on_context_parallel_then_resume_is_bitwise(data, tmp_path):
    """torchrun with 2 ranks (CP2), SIGKILL to every process at a random step after the first
    checkpoint, then --resume: the uninterrupted run's losses and final weights."""
    total = 5
    args = [*_args(data, "pretrain", tmp_path, *CP2), f"--max_iters={total}",
            "--save_interval=2", "--keep_last=20", "--eval_interval=1000", "--eval_prompts=[]"]
    kill9_and_resume(args, tmp_path, total, first_kill=3, ranks=2)


@pytest.mark.parametrize("changes, expected", [
    ({"max_seq_len": 30}, "--max_seq_len 30 is not divisible by 2 x --context_parallel 2 = 4"),
    ({"comm_hook": "powersgd"}, "--comm_hook=powersgd with --context_parallel=2"),
    ({"comm_hook": "overlap_optim", "grad_clip": 0.0},
     "--comm_hook=overlap_optim with --context_parallel=2"),
    ({"dtype": "fp16"}, "--dtype=fp16 with --context_parallel=2"),
    ({"dropout": 0.1}, "--dropout=0.1 with --context_parallel=2"),
    ({"compile": True}, "--compile with --context_parallel=2"),
    ({"context_parallel": 0}, "--context_parallel"),
])
def test_unsupported_combinations_are_refused_in_one_line(changes, expected):
    assert expected in _problems(**{"context_parallel": 2, "max_seq_len": 32, **changes})


def test_supported_combinations_pass_the_option_check(tmp_path):
    """What the tests above, test_train_grid_compose.py and test_train_grid_lora.py train
    with context parallelism (a --data_dir not made yet: the check reads the data's kind where
    it exists, as in a checkout where `make demo` ran)."""
    for changes in ({}, {"zero_stage": 1, "comm_hook": "bf16"}, {"tensor_parallel": 2},
                    {"tensor_parallel": 2, "sequence_parallel": True}, {"pack_samples": True,
                                                                         "task_type": "sft"},
                    {"tensor_parallel": 2, "zero_stage": 1}, {"zero_stage": 3},
                    {"pipeline_parallel": 2}, {"context_parallel": 4},
                    {"lora_rank": 4, "init_from": "base", "task_type": "sft",
                     "tensor_parallel": 2}):
        check_options(options_with(**{"context_parallel": 2, "max_seq_len": 32,
                                      "data_dir": str(tmp_path / "data"), **changes}))
