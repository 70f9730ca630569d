"""Out of memory is a message, not a traceback: before any model is built the memory plan is
compared with what the host (here) or the device has, and a run that cannot fit is warned
about; a failed allocation ends the run with one line (the rank, its plan against its limit,
the options that cut memory), exit 1. No test here really exhausts memory: the host's
available memory is patched, and the allocation that fails asks for 4 EiB (refused at once)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import train_my_ddp
from tests.train_helpers import TINY_ARGS, data_args
from trainer import memory_fit
from utils.cli_errors import run_main as cli_run_main

CUTS = ("--batch_size", "--gradient_accumulation_steps", "--activation_checkpointing",
        "--zero_stage", "--lora_rank")


def allocate_beyond_any_host() -> None:
    torch.empty(1 << 62, dtype=torch.uint8)  # the CPU allocator refuses it: nothing is taken


def raise_cuda_out_of_memory() -> None:  # as CUDA's caching allocator words it
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has "
                                 "a total capacity of 79.19 GiB of which 3.12 GiB is free.")


def raise_memory_error() -> None:
    raise MemoryError()


@pytest.mark.parametrize("fail", [allocate_beyond_any_host, raise_cuda_out_of_memory,
                                  raise_memory_error])
def test_running_out_of_memory_is_one_line_with_the_plan_and_the_cuts(data, tmp_path, capsys,
                                                                      monkeypatch, fail):
    limit = 4096  # bytes: the tiny model's plan is more
    monkeypatch.setattr(memory_fit.psutil, "virtual_memory",
                        lambda: SimpleNamespace(available=limit))
    real_step = train_my_ddp.train_step

    def step_then_run_out_at_the_second(steps, *step_args):
        if steps.counters.step == 1:
            fail()
        return real_step(steps, *step_args)

    monkeypatch.setattr(train_my_ddp, "train_step", step_then_run_out_at_the_second)
    code = cli_run_main(train_my_ddp.main, [*TINY_ARGS, *data_args(data, "pretrain"),
                                            "--max_iters=4", f"--out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    (warning,) = [line for line in err.splitlines() if line.startswith("warning: rank 0")]
    assert "exceeds the 4,096 B of host memory available: it will likely run out" in warning
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert error.startswith("error: rank 0 ran out of memory (")
    assert "; its memory plan is " in error and " against 4,096 B of host memory" in error
    assert all(option in error for option in CUTS), error


def test_a_run_that_fits_says_nothing_of_memory(data, tmp_path, capsys):
    assert cli_run_main(train_my_ddp.main, [*TINY_ARGS, *data_args(data, "pretrain"),
                                            "--max_iters=1",
                                            f"--out_dir={tmp_path / 'run'}"]) == 0
    assert "memory plan (" not in capsys.readouterr().err


def test_on_cuda_the_plan_is_held_against_the_devices_free_memory(monkeypatch):
    """No GPU here: `torch.cuda.mem_get_info` answers as an 80 GiB device with 3 GiB free."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * 2**30, 80 * 2**30))
    env = SimpleNamespace(device=torch.device("cuda", 0), local_world_size=8)
    budget = memory_fit.MemoryBudget(rank=0)
    budget.measure(4 * 2**30, env)
    assert budget.fit_warning().startswith(
        "warning: rank 0's memory plan (4.00 GiB) exceeds the 3.00 GiB free on cuda:0 (of "
        "80.00 GiB): it will likely run out of memory; cut it with a smaller --batch_size")
    budget.measure(2 * 2**30, env)
    assert budget.fit_warning() is None
