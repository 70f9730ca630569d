"""Resuming is exact: a run stopped (or killed) and resumed equals the uninterrupted run.

Reference: the same command run straight through to max_iters. Compared: every step's loss
(exact float equality) and the final model.safetensors (byte equality). Variants: one process
(with gradient accumulation and dropout), DPO, and 2 ranks with plain DDP, ZeRO-1, PowerSGD
and the overlapped optimizer step.
Also: a 2-rank ZeRO-1 run resumed on 1 process continues with the same losses (to rounding);
a run resumed on another layout (ZeRO-0 -> ZeRO-3, ZeRO-1 -> ZeRO-0, bf16 ZeRO-0 -> ZeRO-1,
overlapped optimizer step -> ZeRO-1, ZeRO-0 -> overlapped) equals the uninterrupted run to fp32
rounding (losses, weights, optimizer state by parameter name);
a damaged newest checkpoint is skipped with a warning; --resume without a checkpoint is
a clear error; SIGKILL / SIGTERM / SIGHUP mid-run lose at most the steps since the last checkpoint;
a resume that switches to PowerSGD starts its state fresh.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import train_my_ddp
from model.modeling_z2all import Z2allForCausalLM
from optimizer.distributed_optimizer.zero1_checkpoint import load_resharded_state
from tests.train_helpers import (
    TINY_ARGS,
    data_args,
    final_weights,
    records,
    run_main,
    run_on_two_ranks,
    train_losses,
)
from trainer.config_files import resolve_options, save_config
from trainer.lr_schedule import LRSchedule
from utils.checkpoint import (
    DamagedCheckpointWarning,
    begin_checkpoint,
    finish_checkpoint,
    list_checkpoints,
    verify_checkpoint,
)
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main
from utils.run_directory import MARKER, RUN_MARKER

REPO = Path(__file__).resolve().parents[2]


def _pretrain_args(data, *extra):
    # eval at step 3 (not a checkpoint step) checks that evaluating never perturbs training
    return [*TINY_ARGS, *data_args(data, "pretrain"), "--eval_interval=3", "--save_interval=100",
            *extra]


def _assert_identical(full: Path, cut: Path, last_step: int, resumed_at: int) -> None:
    assert train_losses(cut) == train_losses(full)
    assert len(train_losses(full)) == last_step
    assert final_weights(cut, last_step) == final_weights(full, last_step)
    assert [r["step"] for r in records(cut, "resume")] == [resumed_at]
    assert f"- step {resumed_at} from" in (cut / "report.md").read_text()


def _three_runs(args: list[str], tmp_path: Path, total: int, stop: int) -> list[list[str]]:
    full, cut = tmp_path / "full", tmp_path / "cut"
    return [[*args, f"--out_dir={full}", f"--max_iters={total}"],
            [*args, f"--out_dir={cut}", f"--max_iters={total}", f"--stop_at_iter={stop}"],
            [*args, f"--out_dir={cut}", f"--max_iters={total}", "--resume"]]


@pytest.mark.parametrize("extra", [[], ["--gradient_accumulation_steps=2", "--dropout=0.1",
                                    "--num_workers=2"]],
                         ids=["plain", "accumulation+dropout+workers"])
def test_single_process_resume_is_bitwise(data, tmp_path, extra):
    for argv in _three_runs(_pretrain_args(data, *extra), tmp_path, total=8, stop=4):
        assert run_main(argv) == 0
    _assert_identical(tmp_path / "full", tmp_path / "cut", 8, 4)


def test_dpo_resume_keeps_the_sft_reference(data, tmp_path):
    """If a resumed DPO run took its reference from the resumed policy, losses would differ."""
    init = tmp_path / "init"
    assert run_main([*_pretrain_args(data), f"--out_dir={init}", "--max_iters=4"]) == 0
    args = [*TINY_ARGS, *data_args(data, "dpo"), f"--init_from={init}", "--eval_interval=3",
            "--save_interval=100", "--lr=1e-2"]
    for argv in _three_runs(args, tmp_path, total=6, stop=3):
        assert run_main(argv) == 0
    _assert_identical(tmp_path / "full", tmp_path / "cut", 6, 3)


TWO_RANK_VARIANTS = {
    "ddp": [],
    "zero1": ["--use_distributed_optimizer"],
    "zero1_overlap": ["--use_distributed_optimizer", "--overlap_param_gather",
                      "--overlap_grad_reduce", "--bucket_size=5000"],
    "powersgd": ["--comm_hook=powersgd", "--powersgd_warmup_iters=2"],  # compressing from step 3
    "overlap_optim": ["--comm_hook=overlap_optim", "--grad_clip=0"],
}


# Resumed on another layout: (the cut run's options, the resumed run's, the uninterrupted run
# it must equal). The optimizer state goes by whole-model parameter name between ZeRO-0's
# optimizer.pt, ZeRO's shard files and the overlapped step's per-bucket file; bf16 also carries
# the fp32 main params. The overlapped step cannot clip: its rows train unclipped throughout
# (a resume keeps the saved --grad_clip=0 and takes the saved --comm_hook unless given).
CROSS_LAYOUT = {
    "ddp_to_zero3": (["--zero_stage=0"], ["--zero_stage=3"], "ddp"),
    "zero1_to_ddp": (["--zero_stage=1"], ["--zero_stage=0"], "zero1"),
    "bf16_ddp_to_zero1": (["--dtype=bf16"], ["--dtype=bf16", "--zero_stage=1"], "bf16_ddp"),
    "overlapped_to_zero1": (TWO_RANK_VARIANTS["overlap_optim"],
                            ["--comm_hook=allreduce", "--zero_stage=1"], "overlap_optim"),
    "ddp_to_overlapped": (["--zero_stage=0", "--grad_clip=0"], TWO_RANK_VARIANTS["overlap_optim"],
                          "overlap_optim"),
    # bf16: the overlapped step's fp32 master copies travel by name, both ways
    "bf16_overlapped_to_zero1": ([*TWO_RANK_VARIANTS["overlap_optim"], "--dtype=bf16"],
                                 ["--dtype=bf16", "--comm_hook=allreduce", "--zero_stage=1"],
                                 "bf16_overlapped"),
    "bf16_zero1_to_overlapped": (["--dtype=bf16", "--zero_stage=1", "--grad_clip=0"],
                                 [*TWO_RANK_VARIANTS["overlap_optim"], "--dtype=bf16",
                                  "--zero_stage=0"], "bf16_overlapped"),
}


def test_two_rank_resume_is_bitwise(data, tmp_path):
    """All variants in one spawn of 2 ranks (starting ranks costs more than these runs)."""
    runs = [argv for name, extra in TWO_RANK_VARIANTS.items()
            for argv in _three_runs(_pretrain_args(data, *extra), tmp_path / name, 6, 3)]
    runs.append([*_pretrain_args(data, "--dtype=bf16", "--max_iters=6"),
                 f"--out_dir={tmp_path / 'bf16_ddp' / 'full'}"])
    runs.append([*_pretrain_args(data, *TWO_RANK_VARIANTS["overlap_optim"], "--dtype=bf16",
                                 "--max_iters=6"),
                 f"--out_dir={tmp_path / 'bf16_overlapped' / 'full'}"])
    for name, (saved, resumed, _) in CROSS_LAYOUT.items():
        cut = _three_runs(_pretrain_args(data), tmp_path / name, 6, 3)[1:]
        runs += [[*cut[0], *saved], [*cut[1], *resumed]]
    zero1_args = _pretrain_args(data, *TWO_RANK_VARIANTS["zero1"], "--max_iters=6")
    shrink = tmp_path / "zero1_to_one_rank"
    runs.append([*zero1_args, f"--out_dir={shrink}", "--stop_at_iter=3"])
    assert run_on_two_ranks(*runs) == [0] * len(runs)
    for name in TWO_RANK_VARIANTS:
        _assert_identical(tmp_path / name / "full", tmp_path / name / "cut", 6, 3)
    for name, (_, _, reference) in CROSS_LAYOUT.items():
        _assert_equal_to_rounding(tmp_path / reference / "full", tmp_path / name / "cut", 6, 3)
    # ZeRO-1 saved one optimizer shard per rank, and the manifest requires both (and both
    # ranks' RNG files): a save that misses one is never sealed
    zero1_ckpt = tmp_path / "zero1" / "cut" / "ckpt" / "step_000006"
    required = json.loads((zero1_ckpt / "manifest.json").read_text())["required"]
    assert sorted(path.relative_to(zero1_ckpt).as_posix() for path in zero1_ckpt.rglob("*.pt")
                  ) == sorted(name for name in required if name.endswith(".pt"))
    assert len([name for name in required if name.startswith("optim/zero1_rank")]) == 2

    # Resuming the 2-rank ZeRO-1 run on 1 process with the same global batch (2 x 2 = 1 x 4):
    # the shards are re-cut and the data continues where it stopped; same steps up to
    # rounding (the sum over ranks happens in another order), no longer bitwise.
    with pytest.warns(UserWarning, match="batch_size changed 2 -> 4"):
        assert run_main([*zero1_args, f"--out_dir={shrink}", "--resume", "--batch_size=4"]) == 0
    reference = train_losses(tmp_path / "zero1" / "full")
    resumed = train_losses(shrink)
    assert sorted(resumed) == sorted(reference)
    assert resumed == pytest.approx(reference, rel=1e-4)


def _assert_equal_to_rounding(full: Path, cut: Path, last_step: int, resumed_at: int) -> None:
    """A resume on another layout: losses, weights and (bf16) the fp32 main params equal the
    uninterrupted run's to fp32 rounding (the gradient norm sums in another order). A lost or
    misplaced Adam moment moves a weight by ~lr = 3e-3; main params taken from the bf16
    weights instead of the saved fp32 ones differ by ~4e-3 of a weight."""
    assert [r["step"] for r in records(cut, "resume")] == [resumed_at]
    assert train_losses(cut) == pytest.approx(train_losses(full), rel=1e-5), cut
    last = f"step_{last_step:06d}"
    expected, saved = (load_file(run / "ckpt" / last / "model.safetensors") for run in (full, cut))
    assert sorted(saved) == sorted(expected)
    for key in expected:
        torch.testing.assert_close(saved[key].float(), expected[key].float(), rtol=1e-4,
                                   atol=1e-5, msg=f"{cut}: {key}")
    expected_state, saved_state = (_whole_optimizer_state(run / "ckpt" / last)
                                   for run in (full, cut))
    bf16 = next(iter(expected.values())).dtype == torch.bfloat16  # both sides keep fp32 masters
    for name, piece in expected_state.items():
        if bf16:  # (so the main params below are compared, not skipped)
            assert None not in (piece["main_param"], saved_state[name]["main_param"]), name
        for key in ("main_param", "exp_avg", "exp_avg_sq"):
            if piece[key] is not None and saved_state[name][key] is not None:
                torch.testing.assert_close(saved_state[name][key], piece[key], rtol=1e-4,
                                           atol=1e-6, msg=f"{cut}: {key} of {name}")


def _whole_optimizer_state(ckpt_dir: Path) -> dict[str, dict]:
    """{parameter name: its whole optimizer tensors}, whatever layout saved them."""
    shapes = {name: list(param.shape) for name, param in
              Z2allForCausalLM.from_pretrained(ckpt_dir).named_parameters()}
    whole = load_resharded_state(ckpt_dir / "optim",
                                 [(name, 0, math.prod(shape)) for name, shape in shapes.items()],
                                 shapes, rank=0, world_size=1, trainable=shapes)
    return {piece["name"]: piece for piece in whole["pieces"]}


def test_damaged_newest_checkpoint_is_skipped(data, tmp_path):
    args = _pretrain_args(data, "--save_interval=2", "--keep_last=5")
    assert run_main([*args, f"--out_dir={tmp_path / 'full'}", "--max_iters=8"]) == 0
    cut = tmp_path / "cut"
    assert run_main([*args, f"--out_dir={cut}", "--max_iters=8", "--stop_at_iter=6"]) == 0
    weights = cut / "ckpt" / "step_000006" / "model.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-3] ^= 0x55
    weights.write_bytes(bytes(damaged))
    with pytest.warns(DamagedCheckpointWarning, match="step_000006.*sha256"):
        assert run_main([*args, f"--out_dir={cut}", "--max_iters=8", "--resume"]) == 0
    _assert_identical(tmp_path / "full", cut, 8, 4)


def test_a_checkpoint_whose_state_is_refused_is_skipped(data, tmp_path):
    """It verifies (resealed with a correct manifest) but its optimizer state is of another
    kind: --resume warns, naming it, and goes on from the one before."""
    args = _pretrain_args(data, "--save_interval=2", "--keep_last=5")
    assert run_main([*args, f"--out_dir={tmp_path / 'full'}", "--max_iters=8"]) == 0
    cut = tmp_path / "cut"
    assert run_main([*args, f"--out_dir={cut}", "--max_iters=8", "--stop_at_iter=6"]) == 0
    newest = cut / "ckpt" / "step_000006"
    required = json.loads((newest / "manifest.json").read_text())["required"]
    tmp_dir = begin_checkpoint(cut / "ckpt", 6)
    shutil.copytree(newest, tmp_dir, dirs_exist_ok=True)
    (tmp_dir / "manifest.json").unlink()
    torch.save({"format": "someone-else's optimizer"}, tmp_dir / "optim" / "optimizer.pt")
    assert verify_checkpoint(finish_checkpoint(tmp_dir, 6, required=required, keep_last=5)) is None
    with pytest.warns(DamagedCheckpointWarning, match="step_000006: its state does not load"):
        assert run_main([*args, f"--out_dir={cut}", "--max_iters=8", "--resume"]) == 0
    _assert_identical(tmp_path / "full", cut, 8, 4)


def test_resume_without_checkpoint_is_a_clear_error(data, tmp_path, capsys):
    argv = [*_pretrain_args(data), f"--out_dir={tmp_path / 'empty'}", "--resume"]
    with pytest.raises(ValueError, match="--resume: .*empty holds no run to continue"):
        run_main(argv)
    assert not (tmp_path / "empty").exists()  # a failed start leaves nothing behind
    save_config(resolve_options(argv[:-1])[0], tmp_path / "empty")  # a config, no run marker
    with pytest.raises(ValueError, match="empty holds no z2all run to resume"):
        run_main(argv)
    assert cli_run_main(train_my_ddp.main, argv) == EXIT_BAD_INPUT  # one line, exit code 2
    assert capsys.readouterr().err.count("\n") == 1
    (tmp_path / "empty" / RUN_MARKER).write_text(json.dumps(MARKER))  # a run, no checkpoint
    assert cli_run_main(train_my_ddp.main, argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: --resume: ") and "stopped before its first checkpoint: " \
        "nothing to resume; start it again there without --resume" in err, err


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP],
                         ids=["kill", "term", "hangup"])
def test_interrupted_process_resumes_from_its_last_checkpoint(data, tmp_path, signum):
    total = 60
    args = _pretrain_args(data, "--save_interval=5", f"--max_iters={total}", "--eval_interval=50")
    cut = tmp_path / "cut"
    process = subprocess.Popen([sys.executable, "train_my_ddp.py", *args, f"--out_dir={cut}"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list_checkpoints(cut / "ckpt") and process.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    process.send_signal(signum)
    returncode = process.wait(timeout=60)
    stderr = process.stderr.read().decode()
    assert returncode in (-signal.SIGKILL, 128 + signum), stderr
    saved_steps = [step for step, _ in list_checkpoints(cut / "ckpt")]
    assert saved_steps and saved_steps[-1] < total
    if signum != signal.SIGKILL:  # stopped cleanly: a checkpoint at the step it stopped
        assert saved_steps[-1] == records(cut, "train")[-1]["step"]

    assert run_main([*args, f"--out_dir={cut}", "--resume"]) == 0
    assert run_main([*args, f"--out_dir={tmp_path / 'full'}"]) == 0
    _assert_identical(tmp_path / "full", cut, total, saved_steps[-1])


def test_resume_with_another_comm_hook_starts_the_hook_fresh(data, tmp_path):
    """The checkpoint holds no PowerSGD state when the run began with plain all-reduce."""
    args = _pretrain_args(data, "--max_iters=4", "--powersgd_warmup_iters=0")
    run = tmp_path / "run"
    assert run_main([*args, f"--out_dir={run}", "--stop_at_iter=2"]) == 0
    with pytest.warns(UserWarning, match="comm_hook changed"):
        assert run_main([*args, f"--out_dir={run}", "--resume", "--comm_hook=powersgd"]) == 0
    assert sorted(train_losses(run)) == [1, 2, 3, 4]


@pytest.mark.parametrize(("save_interval", "caught_by"), [
    (1, "the weights are"), (5, "the loss or gradient norm is")])
def test_a_non_finite_loss_stops_the_run_without_saving_it(data, tmp_path, monkeypatch,
                                                           save_interval, caught_by):
    """An infinite learning rate (the options refuse `--lr=inf`, so the schedule is patched)
    turns the weights to NaN after the first update: the run must stop with a message naming
    the step (at the save of step 1, or at step 2's NaN loss), and no checkpoint may hold the
    NaN weights."""
    monkeypatch.setattr(LRSchedule, "__call__", lambda self, step: math.inf)
    run_dir = tmp_path / "diverged"
    args = _pretrain_args(data, f"--save_interval={save_interval}",
                          "--max_iters=6", f"--out_dir={run_dir}")
    message = rf"error: step \d: {caught_by} not finite.*stopped without saving"
    with pytest.raises(SystemExit, match=message):
        run_main(args)
    for _, ckpt_dir in list_checkpoints(run_dir / "ckpt"):
        weights = load_file(ckpt_dir / "model.safetensors")
        assert all(torch.isfinite(tensor).all() for tensor in weights.values()), ckpt_dir


def test_a_second_stop_signal_ends_the_process_at_once():
    """The first SIGTERM waits for the end of the step (here: a step that never ends); an
    immediate repeat (torchrun forwarding the same request) changes nothing; a second one
    after the grace time ends the process."""
    script = ("import os, signal, time\n"
              "from trainer.stop_signal import StopSignal\n"
              "with StopSignal() as stop:\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    assert stop.received == signal.SIGTERM\n"
              "    print('first signal noted', flush=True)\n"
              "    time.sleep(stop.REPEAT_GRACE_S + 0.5)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(60)\n"
              "print('survived')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == -signal.SIGTERM, result.stderr
    assert result.stdout == "first signal noted\n"


def test_resume_says_each_change_once_and_a_relative_path_is_no_change(data, tmp_path,
                                                                       monkeypatch, capsys):
    """config.json records the tokenizer directory absolute: the same directory given
    relative on --resume is no change; a real change is said once (a warning, not also a
    note)."""
    args = [*TINY_ARGS, "--task_type=pretrain", f"--data_dir={data['pretrain']}",
            "--eval_prompts=[]", f"--out_dir={tmp_path / 'run'}"]
    assert run_main([*args, f"--tokenizer_dir={data['tokenizer']}", "--max_iters=1"]) == 0
    monkeypatch.chdir(data["tokenizer"].parent)
    capsys.readouterr()
    with pytest.warns(UserWarning) as caught:
        assert run_main([*args, f"--tokenizer_dir={data['tokenizer'].name}", "--resume",
                         "--max_iters=2"]) == 0
    said = [str(warning.message) for warning in caught] + capsys.readouterr().out.splitlines()
    assert [line for line in said if "changed" in line] == [
        "resume: max_iters changed 1 -> 2 (breaks bitwise reproducibility)"], said
