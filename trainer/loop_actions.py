"""What the training loop does besides stepping: evaluate, checkpoint, log, stop on divergence,
and write the report card at the end. Each is one call in train_my_ddp.py's loop."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from parallel_plan.memory_plan import measure_memory
from trainer.distributed_env import DistributedEnv, all_reduce_sum
from trainer.report import write_report
from trainer.rollouts import RolloutData
from trainer.setup import Reporting, Run, RunPlace, Stepping
from trainer.training_checkpoint import save_training_checkpoint
from utils.checkpoint import list_checkpoints
from utils.precision import PrecisionChoice
from utils.run_directory import checkpoints_dir


def evaluate(steps: Stepping, report: Reporting) -> float:
    """Evaluate at the current step, log metrics and samples; return the validation loss
    (`ckpt/best` follows the manifests' val_loss). Not counted as stepping by the ETA."""
    with report.progress.paused():
        metrics, samples = report.evaluator(steps.parallel.eval_model, steps.model,
                                            steps.parallel.whole_model)
    step = steps.counters.step
    if samples:
        report.log.log("samples", step, quiet=True, samples=samples)
        for sample in samples:  # above the bar on a terminal, never glued onto its line
            report.progress.write(f"  [sample] {sample['prompt']!r} -> "
                                  f"{sample['completion']!r}")
    report.log.log("eval", step, **metrics)
    return metrics["val_loss"]


def save_checkpoint(run: Run, val_loss: float | None) -> Path:
    """Collective: every rank writes its part of `ckpt/step_N` (trainer/training_checkpoint.py).
    Not counted as stepping by the ETA."""
    place, steps = run.place, run.steps
    steps.optimizer.finish_param_sync()  # ZeRO-1's overlapped all-gather: wait for the weights
    # The last update may have made them NaN even from a finite loss (e.g. a huge LR): such
    # weights never become a checkpoint. All ranks vote (a grid's ranks hold different parts;
    # ZeRO-3's are gathered inside whole_model(), which rank 0 saves).
    with run.report.progress.paused(), steps.parallel.whole_model() as whole_model:
        nonfinite = not all(torch.isfinite(param).all() for param in steps.model.parameters())
        if all_reduce_sum([float(nonfinite)], place.env)[0]:
            stop_diverged(run, "the weights are not finite")
        path = _save(place, steps, whole_model, val_loss)
    if place.env.is_main:
        print(f"saved checkpoint {path}", flush=True)
    return path


def _save(place: RunPlace, steps: Stepping, whole_model: torch.nn.Module | None,
          val_loss: float | None) -> Path:
    counters = steps.counters
    return save_training_checkpoint(
        place.env, checkpoints_dir(place.run_dir), counters.step, model=whole_model,
        optimizer=steps.optimizer,
        trainer_state={"step": counters.step, "tokens_seen": counters.tokens_seen,
                       "consumed_samples": counters.consumed_samples,
                       "config": place.options.to_dict()},
        comm_hook_state=(steps.parallel.comm_hook_state
                         and steps.parallel.comm_hook_state.state_dict()),
        keep_last=place.options.run.keep_last, val_loss=val_loss,
        data_state=steps.data.state_dict(),
        lora=place.lora_base and (place.options.lora.config(), place.lora_base))


def log_training(run: Run, lr: float, grad_norm: float, stepped: bool, loss_sum: torch.Tensor,
                 extra_sums: dict[str, torch.Tensor]) -> None:
    """The step's loss (and task extras), the global batch's: each rank holds its replica's
    sum of shares (trainer/global_batch.py), the same on every rank of a replica, so their
    average over the ranks; with the LR, gradient norm, tokens and throughput. Collective:
    every rank calls it at the same steps."""
    env, steps, report = run.place.env, run.steps, run.report
    names = ["loss", *extra_sums]
    sums = all_reduce_sum([float(loss_sum), *map(float, extra_sums.values())], env)
    counts = {}
    if run.place.options.data.skip_bad_records:  # counted, never silent
        (counts["bad_records_skipped"],) = all_reduce_sum([float(steps.data.skipped_records())],
                                                          env)
    # Streamed records dropped or cut (the same metric names on every rank; pretokenized data
    # has none here: the pretokenizer reported them). Shown once they happen.
    policy = steps.data.policy_counts()
    totals = all_reduce_sum([float(count) for count in policy.values()], env) if policy else []
    counts |= {name: int(total) for name, total in zip(policy, totals) if total}
    averages = {name: total / env.world_size for name, total in zip(names, sums)}
    if isinstance(steps.data, RolloutData):  # the round's rewards, already global
        averages |= steps.data.step_metrics()
    throughput = report.meter.report()
    stats = steps.parallel.pipeline_stats()
    if stats is not None:  # rank 0's idle share
        counts.update(bubble_theory=stats.bubble_theory, bubble_measured=stats.bubble_measured)
    report.log.log("train", steps.counters.step, **counts, lr=lr, grad_norm=grad_norm,
                skipped=not stepped, tokens=steps.counters.tokens_seen, **averages, **throughput)
    if not report.memory_measured:  # the plan printed at start-up, checked (Adam state exists)
        report.memory_measured = True
        per_rank = _measured_memory_of_every_rank(steps, env)
        report.log.log("memory", steps.counters.step, quiet=True, **per_rank[0], per_rank=per_rank)
    report.progress.update(steps.counters.step, throughput.get("tokens_per_sec", 0.0),
                        averages["loss"])


def _measured_memory_of_every_rank(steps: Stepping, env: DistributedEnv
                                   ) -> list[dict[str, int]]:
    """`measure_memory` of each rank, in rank order (collective: a sum of vectors in which
    each rank fills its own slots). On a grid the ranks differ: stage, slices, shards."""
    mine = measure_memory(steps.ddp, steps.optimizer)
    slots = [0.0] * (len(mine) * env.world_size)
    slots[env.rank * len(mine):(env.rank + 1) * len(mine)] = map(float, mine.values())
    summed = all_reduce_sum(slots, env)  # float64: exact for byte counts below 2^53
    return [dict(zip(mine, map(int, summed[rank * len(mine):(rank + 1) * len(mine)])))
            for rank in range(env.world_size)]


def stop_diverged(run: Run, what: str) -> None:
    """Diverged: the weights are (or are about to be) NaN, and every later step and checkpoint
    would be too. Stop without saving, naming the newest good checkpoint."""
    run.report.log.close()
    newest = list_checkpoints(checkpoints_dir(run.place.run_dir))
    raise SystemExit(f"error: step {run.steps.counters.step}: {what}; stopped without saving. "
                     f"Newest checkpoint: {newest[-1][1] if newest else 'none'}. Lower --lr, or "
                     "check the data.")


def is_diverged(precision: PrecisionChoice, nonfinite_loss_votes: float, grad_norm: float
                ) -> bool:
    """fp16's loss scaler skips an overflowing step and retries instead: not a divergence."""
    return precision.dtype != "fp16" and (nonfinite_loss_votes > 0
                                          or not math.isfinite(grad_norm))


def finish(place: RunPlace, report: Reporting) -> None:
    """The report card (rank 0) and the metrics file closed."""
    if place.env.is_main:
        environment = {"device": str(place.env.device), "world_size": place.env.world_size,
                       "precision": place.precision.reason,
                       "threads_per_rank": torch.get_num_threads(),
                       "kernels": report.kernels.removeprefix("kernels: ")}
        card = write_report(place.run_dir, place.options, environment, report.meter.summary(),
                            place.tokenizer.fingerprint)
        report.progress.write(f"report: {card}")
    report.progress.close()
    report.log.close()
