"""Resuming on another grid: the optimizer state is saved layout-neutral (every Adam tensor
whole, in ZeRO-1's shard-file format) and cut again for the new grid on load.

Runs: 3 steps on TP2 (2 gloo ranks), stopped (saved), then resumed for 2 more steps on PP2
(2 ranks), and also in one process (which reads ZeRO-1 shard files with --zero_stage=1, and
gathers them whole into ZeRO-0's order with --zero_stage=0); and the other way, one-process
ZeRO-1 and ZeRO-0 (optimizer.pt, read by parameter name) runs resumed on TP2, and a
one-process run of the overlapped step (`--comm_hook=overlap_optim`: its per-bucket file, read
by the names it stores) resumed on TP2 with the plain hook (both unclipped, as that step is).
Reference: one process trained 5 steps without a stop. Both grids have one data-parallel
replica, so the data position carries over exactly. Compared: every step's loss and the
final model.safetensors, to fp32 rounding (not bitwise: the reductions run in another order;
the same-grid resume stays bitwise, test_train_grid.py). The grid's optimizer file holds one
whole piece per parameter of the whole model, under its names. And on 4 ranks with streamed
data: DP2 x TP2 resumed as DP2 x PP2 (each replica's stream position carried over); and
with pretokenized data both ways, DP2 x TP2 <-> DP2 x PP2, giving only the new grid's option
(the saved grid is not mixed into it: trainer/config_files.py `_whole_grid`).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from model.modeling_z2all import Z2allForCausalLM
from optimizer.distributed_optimizer.zero1_checkpoint import find_shard_files
from parallel.local_ranks import run_on_ranks
from tests.parallel.grid_helpers import ADAM_EPS
from tests.train_helpers import records, run_main, run_on_two_ranks, train_losses
from tests.trainer.test_train_grid import GRID_MODEL, _args, _runs_on_rank
from tests.trainer.test_train_stream import stream_args

TOTAL, STOP = 5, 3


def _grid_args(data, *extra) -> list[str]:
    return [*_args(data, f"--max_iters={TOTAL}", f"--adam_eps={ADAM_EPS}", "--lr=1e-2",
                   "--eval_prompts=[]"), *extra]


def test_resume_on_another_grid_equals_an_uninterrupted_run(data, tmp_path):
    cut, cut_single, zero1 = tmp_path / "cut", tmp_path / "cut_single", tmp_path / "zero1"
    cut_zero0, zero0 = tmp_path / "cut_zero0", tmp_path / "zero0"
    overlapped, unclipped = tmp_path / "overlapped", ["--grad_clip=0"]  # (its step cannot clip)
    assert run_main([*_grid_args(data, "--zero_stage=1"), f"--out_dir={zero1}",
                     f"--stop_at_iter={STOP}"]) == 0  # one process, ZeRO-1 shard files
    assert run_main([*_grid_args(data, "--zero_stage=0"), f"--out_dir={zero0}",
                     f"--stop_at_iter={STOP}"]) == 0  # one process, ZeRO-0's optimizer.pt
    assert run_main([*_grid_args(data, "--comm_hook=overlap_optim", *unclipped),
                     f"--out_dir={overlapped}", f"--stop_at_iter={STOP}"]) == 0  # per bucket
    assert run_on_two_ranks([*_grid_args(data, "--tensor_parallel=2"), f"--out_dir={cut}",
                             f"--stop_at_iter={STOP}"]) == [0]
    shutil.copytree(cut, cut_single, symlinks=True)
    shutil.copytree(cut, cut_zero0, symlinks=True)
    assert run_on_two_ranks(  # TP2 -> PP2, and one-process ZeRO-1 and ZeRO-0 -> TP2
        [*_grid_args(data, "--tensor_parallel=1", "--pipeline_parallel=2"), f"--out_dir={cut}",
         "--resume"],
        [*_grid_args(data, "--tensor_parallel=2", "--zero_stage=0"), f"--out_dir={zero1}",
         "--resume"],
        [*_grid_args(data, "--tensor_parallel=2"), f"--out_dir={zero0}", "--resume"],
        [*_grid_args(data, "--tensor_parallel=2", "--comm_hook=allreduce", *unclipped),
         f"--out_dir={overlapped}", "--resume"]
    ) == [0, 0, 0, 0]
    for stage, resumed in ((1, cut_single), (0, cut_zero0)):  # TP2 -> one process
        assert run_main([*_grid_args(data, "--tensor_parallel=1", f"--zero_stage={stage}"),
                         f"--out_dir={resumed}", "--resume"]) == 0
    full, full_unclipped = tmp_path / "full", tmp_path / "full_unclipped"
    assert run_main([*_grid_args(data), f"--out_dir={full}"]) == 0
    assert run_main([*_grid_args(data, *unclipped), f"--out_dir={full_unclipped}"]) == 0

    for resumed, reference in ((cut, full), (cut_single, full), (zero1, full), (cut_zero0, full),
                               (zero0, full), (overlapped, full_unclipped)):
        expected = load_file(reference / "ckpt" / f"step_{TOTAL:06d}" / "model.safetensors")
        assert [r["step"] for r in records(resumed, "resume")] == [STOP]
        assert train_losses(resumed) == pytest.approx(train_losses(reference), rel=1e-5), resumed
        saved = load_file(resumed / "ckpt" / f"step_{TOTAL:06d}" / "model.safetensors")
        assert sorted(saved) == sorted(expected)
        for key in expected:  # a lost or misplaced Adam moment moves a weight by ~lr = 1e-2
            torch.testing.assert_close(saved[key], expected[key], rtol=1e-4, atol=1e-5,
                                       msg=f"{resumed.name}: {key}")
    last = cut / "ckpt" / f"step_{TOTAL:06d}"
    (shard_file,) = find_shard_files(last / "optim")
    pieces = torch.load(shard_file, weights_only=True)["pieces"]
    whole = Z2allForCausalLM.from_pretrained(last)
    assert ({piece["name"]: (piece["start"], piece["end"]) for piece in pieces}
            == {name: (0, param.numel()) for name, param in whole.named_parameters()})
    assert {piece["step"] for piece in pieces} == {TOTAL}


def test_streamed_data_resumes_per_replica_on_another_grid(data, tmp_path):
    """DP2 x TP2 -> DP2 x PP2 on 4 ranks: the stream's position is kept per data-parallel
    replica, on the saved grid's ranks 0 and 2; the new grid must read those (not its own
    replica leaders 0 and 1, where rank 1 holds a copy of replica 0's state)."""
    args = [*stream_args(data), *GRID_MODEL[:2], f"--adam_eps={ADAM_EPS}", "--lr=1e-2",
            "--save_interval=100", f"--max_iters={TOTAL}"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    runs = [[*args, "--tensor_parallel=2", f"--out_dir={full}"],
            [*args, "--tensor_parallel=2", f"--out_dir={cut}", f"--stop_at_iter={STOP}"],
            [*args, "--tensor_parallel=1", "--pipeline_parallel=2", f"--out_dir={cut}",
             "--resume"]]
    assert run_on_ranks(_runs_on_rank, runs, world_size=4, timeout=600) == [[0, 0, 0]] * 4
    assert train_losses(cut) == pytest.approx(train_losses(full), rel=1e-5)
    expected = load_file(full / "ckpt" / f"step_{TOTAL:06d}" / "model.safetensors")
    saved = load_file(cut / "ckpt" / f"step_{TOTAL:06d}" / "model.safetensors")
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)


def test_pretokenized_data_resumes_on_another_grid_with_two_replicas(data, tmp_path):
    """DP2 x TP2 -> DP2 x PP2 and DP2 x PP2 -> DP2 x TP2 on 4 ranks, pretokenized data: both
    replicas continue the one global sample order where the saved grid stopped."""
    tp2, pp2 = ["--tensor_parallel=2"], ["--pipeline_parallel=2"]
    full, tp_to_pp, pp_to_tp = tmp_path / "full", tmp_path / "tp_to_pp", tmp_path / "pp_to_tp"
    runs = [_grid_args(data, *tp2, f"--out_dir={full}"),
            _grid_args(data, *tp2, f"--out_dir={tp_to_pp}", f"--stop_at_iter={STOP}"),
            _grid_args(data, *pp2, f"--out_dir={tp_to_pp}", "--resume"),
            _grid_args(data, *pp2, f"--out_dir={pp_to_tp}", f"--stop_at_iter={STOP}"),
            _grid_args(data, *tp2, f"--out_dir={pp_to_tp}", "--resume")]
    assert run_on_ranks(_runs_on_rank, runs, world_size=4, timeout=600) == [[0] * 5] * 4
    expected = load_file(full / "ckpt" / f"step_{TOTAL:06d}" / "model.safetensors")
    for resumed in (tp_to_pp, pp_to_tp):
        assert [r["step"] for r in records(resumed, "resume")] == [STOP]
        assert train_losses(resumed) == pytest.approx(train_losses(full), rel=1e-5), resumed
        saved = load_file(resumed / "ckpt" / f"step_{TOTAL:06d}" / "model.safetensors")
        for key in expected:
            torch.testing.assert_close(saved[key], expected[key], rtol=1e-4, atol=1e-5,
                                       msg=f"{resumed.name}: {key}")
