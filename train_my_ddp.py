"""Train a z2all model: pretraining, SFT or DPO, on 1 CPU process or N GPUs, with our own DDP.

    python train_my_ddp.py --task_type=pretrain --data_dir=... --out_dir=out/run1
    torchrun --nproc_per_node=8 train_my_ddp.py exp_config.py --use_distributed_optimizer
    python train_my_ddp.py --resume --out_dir=out/run1          # newest valid checkpoint
    python train_my_ddp.py --help                               # every option, grouped

This file is parse -> build -> loop -> close. The options are in trainer/options.py (one
group per concern; the data group is dataset/data_config.py), and everything the loop steps is
built by `trainer.setup.build_run` (its docstring gives the order). One optimizer step is

    count the global batch's loss tokens (all-reduced: each loss is a sum over them / that count)
    for each of gradient_accumulation_steps micro-batches:   (no_sync() on all but the last,
        loss = forward_step(batch)                             so gradients are reduced once)
        backward(loss)
    ddp.finish_grad_sync()       # gradients averaged over ranks (ZeRO-1: reduce-scattered)
    optimizer.step()             # clip, AdamW (ZeRO-1: on this rank's shard, then all-gather)

Only `forward_step` differs between tasks (trainer/forward_steps.py). With --zero_stage 2/3 the
wrapper shards gradients (and parameters) but offers the same calls; on a tensor/pipeline grid
(--tensor_parallel, --pipeline_parallel) the pipeline schedule runs the micro-batches instead
of the loop above (`GridRun.forward_backward`, trainer/model_parallel.py); with
--context_parallel the same loop runs and the model computes this rank's share of every
sequence. The effective batch is batch_size x gradient_accumulation_steps x data-parallel size
(the world size, divided by tensor_parallel x pipeline_parallel x context_parallel) sequences.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

from trainer.config_files import options_from_argv, resolve_options
from trainer.distributed_env import (
    DistributedEnv,
    all_reduce_sum,
    check_on_main,
    init_distributed,
    shutdown_distributed,
)
from trainer.evaluation import to_device
from trainer.global_batch import attach_per_replica, global_counts
from trainer.loop_actions import (
    evaluate,
    finish,
    is_diverged,
    log_training,
    save_checkpoint,
    stop_diverged,
)
from trainer.memory_fit import out_of_memory_explained
from trainer.option_validation import check_init_from, check_paths
from trainer.options import TrainingOptions
from trainer.run_claim import RunDirClaim, exclusive_run_dir
from trainer.setup import Run, Stepping, build_run
from trainer.shared_filesystem import check_shared_filesystem
from trainer.stop_signal import StopSignal
from trainer.throughput import ThroughputMeter
from utils.cli_errors import run_main
from utils.log_setup import configure_logging
from utils.parent_death import die_with_parent
from utils.run_directory import run_dir_moved, write_heartbeat
from utils.run_ownership import earlier_run


def train_step(steps: Stepping, meter: ThroughputMeter, env: DistributedEnv,
               micro_batches: list[dict[str, torch.Tensor]]
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward and backward of every micro-batch, gradients accumulated
    (trainer/parallelize.py: a micro-batch loop, or the pipeline's schedule); returns the
    summed loss and task extras: this replica's shares of the global batch's, which the
    caller averages over the replicas. Each loss term is divided by its count over the whole
    global batch, so every split of it is one objective (trainer/global_batch.py)."""
    micro_batches = [to_device(batch, env.device) for batch in micro_batches]
    for batch in micro_batches:
        if steps.share.counts_tokens:  # ranks that share a batch count it once
            meter.count_batch(batch)
    totals = global_counts(micro_batches, steps.share.counts_tokens, env)
    attach_per_replica(micro_batches, totals, replicas=steps.share.world_size)
    return steps.parallel.forward_backward(steps.forward_step, micro_batches)


def train(run: Run, stop_signal: StopSignal, claim: RunDirClaim) -> int:
    """The loop: step, log, evaluate, checkpoint, until --max_iters, --stop_at_iter or a stop
    signal. Returns the exit code. Stops (`RunDirMoved`) before writing anything once the run
    dir has been moved: it writes by path, and the path may now name another run."""
    place, steps, report = run.place, run.steps, run.report
    options, env, counters = place.options, place.env, steps.counters
    accumulation = options.optimization.gradient_accumulation_steps
    batches = iter(steps.data)
    if options.eval.eval_at_start and place.resumed_from is None:
        evaluate(steps, report)  # the untrained baseline (about ln(vocab))
    stop_requested = False
    steps.model.train()
    if env.is_main:
        write_heartbeat(place.run_dir, counters.step)
    while counters.step < report.stop_step and not stop_requested:
        report.meter.start_step()
        lr = steps.schedule(counters.step)
        steps.optimizer.set_lr(lr)
        steps.optimizer.zero_grad()
        micro_batches = [next(batches) for _ in range(accumulation)]
        loss_sum, extra_sums = train_step(steps, report.meter, env, micro_batches)
        steps.ddp.finish_grad_sync()
        stepped, grad_norm = steps.optimizer.step()
        counters.step += 1
        counters.consumed_samples += steps.global_batch
        # One small all-reduce per step: did any rank get a stop signal or a non-finite loss,
        # was the run dir moved, and the step's tokens.
        stop_votes, nonfinite_votes, moved_votes, step_tokens = all_reduce_sum(
            [float(stop_signal.received is not None), float(not torch.isfinite(loss_sum)),
             float(claim.moved()), report.meter.local_step_tokens], env)
        if moved_votes:
            raise run_dir_moved(place.run_dir, counters.step)
        stop_requested = stop_votes > 0
        counters.tokens_seen += int(step_tokens)
        report.meter.end_step(step_tokens, steps.ddp.comm_bytes_last_step)
        if env.is_main:
            write_heartbeat(place.run_dir, counters.step)
        diverged = is_diverged(place.precision, nonfinite_votes, grad_norm)

        finished = counters.step == report.stop_step or stop_requested
        if counters.step % options.run.log_interval == 0 or finished or diverged:
            log_training(run, lr, grad_norm, stepped, loss_sum, extra_sums)
        if diverged:
            stop_diverged(run, f"the loss or gradient norm is not finite (grad_norm={grad_norm})")
        val_loss = None
        if counters.step % options.eval.eval_interval == 0 or finished:
            val_loss = evaluate(steps, report)
        if counters.step % options.run.save_interval == 0 or finished:
            save_checkpoint(run, val_loss, claim)

    finish(place, report)
    if stop_requested:
        print(f"stopped by {stop_signal.name()} at step {counters.step} (checkpoint saved)",
              flush=True)
        return stop_signal.exit_code()
    return 0


RELAUNCH_COUNTS = {"TORCHELASTIC_RESTART_COUNT": "torchrun restart",  # --max_restarts
                   "SLURM_RESTART_COUNT": "SLURM requeue"}                # sbatch --requeue


def relaunch_resumes(argv: list[str], options: TrainingOptions, notes: list[str]
                     ) -> tuple[TrainingOptions, list[str]]:
    """The options of a command that torchrun or SLURM started again with its first command
    line (torchrun `--max_restarts` after a rank failed; a job requeued after it lost a node):
    `--resume` added once the run has a checkpoint, since that command line would start afresh
    over the run's own checkpoints, which a fresh run refuses. Every rank reads the same run
    dir (a shared one: trainer/shared_filesystem.py), and no rank writes a checkpoint before
    the start-up checks, so all of them decide alike."""
    relaunched = [f"{what} {os.environ[name]}" for name, what in RELAUNCH_COUNTS.items()
                  if os.environ.get(name, "0") not in ("", "0")]
    if not relaunched or options.run.resume or not earlier_run(Path(options.run.out_dir)):
        return options, notes
    # the same command line with --resume (its --help or --print_config has exited already)
    options, notes = resolve_options([*argv, "--resume"])
    return options, [*notes, f"note: {', '.join(relaunched)}: resuming the run from its "
                             "newest checkpoint"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    options, notes = relaunch_resumes(argv, *options_from_argv(argv))
    check_paths(options)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank under torchrun: docs/guarantees.md
        die_with_parent(signal.SIGKILL)
    env = init_distributed(options.system.device, options.system.num_threads,
                           timeout_s=60 * options.parallel.dist_timeout)
    configure_logging(options.run.verbose, env.is_main)
    try:
        # one line per run, not per rank; every rank starts from the model rank 0 checked
        init = check_on_main(lambda: check_init_from(options), env)
        with (exclusive_run_dir(options.run, env) as claim, StopSignal() as stop_signal,
              out_of_memory_explained(env) as memory_budget):
            check_shared_filesystem(Path(options.run.out_dir), claim.check_token, {
                "--data_dir": options.data.data_dir, "--tokenizer_dir": options.data.tokenizer_dir,
                "--init_from": options.model.init_from}, env)  # several nodes: one filesystem
            run = build_run(options, env, notes + claim.notes, init, memory_budget)
            claim.started = True
            return train(run, stop_signal, claim)
    finally:
        shutdown_distributed(env)


if __name__ == "__main__":
    sys.exit(run_main(main))
