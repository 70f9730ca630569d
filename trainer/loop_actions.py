"""What the training loop does besides stepping: evaluate, checkpoint, log, stop on divergence,
and write the report card at the end. Each is one call in train_my_ddp.py's loop."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import torch

from parallel_plan.memory_plan import measure_memory
from trainer.distributed_env import DistributedEnv, all_reduce_sum, all_reduce_sum_lists
from trainer.report import write_report
from trainer.rollouts import RolloutData
from trainer.run_claim import RunDirClaim
from trainer.setup import Reporting, Run, RunPlace, Stepping
from trainer.training_checkpoint import save_training_checkpoint
from utils.checkpoint import list_checkpoints
from utils.cli_errors import EXIT_RUNTIME_FAILURE, ReportedElsewhere
from utils.precision import PrecisionChoice
from utils.run_directory import checkpoints_dir, run_dir_moved


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


def save_checkpoint(run: Run, val_loss: float | None, claim: RunDirClaim) -> Path:
    """Collective: every rank writes its part of `ckpt/step_N` (trainer/training_checkpoint.py).
    Not counted as stepping by the ETA. A run dir moved while it writes stops the run
    (`stop_if_moved_meanwhile`)."""
    place, steps = run.place, run.steps
    with stop_if_moved_meanwhile(place, steps.counters.step, claim):
        steps.optimizer.finish_param_sync()  # ZeRO-1's overlapped all-gather: wait for the weights
        # The last update may have made the weights NaN even from a finite loss (e.g. a huge
        # LR): such weights never become a checkpoint. All ranks vote (a grid's ranks hold
        # different parts; ZeRO-3's are gathered inside whole_model(), which rank 0 saves).
        with run.report.progress.paused(), steps.parallel.whole_model() as whole_model:
            nonfinite = not all(torch.isfinite(param).all()
                                for param in steps.model.parameters())
            if all_reduce_sum([float(nonfinite)], place.env)[0]:
                stop_diverged(run, "the weights are not finite")
            path = _save(place, steps, whole_model, val_loss)
    if place.env.is_main:
        print(f"saved checkpoint {path}", flush=True)
    return path


@contextlib.contextmanager
def stop_if_moved_meanwhile(place: RunPlace, step: int, claim: RunDirClaim) -> Iterator[None]:
    """A write that failed because the run dir was moved, replaced or deleted while it ran (a
    checkpoint save) ends the run as the per-step check does (`RunDirMoved`, exit 1, said by
    rank 0), not as a missing path (exit 2 naming a temp file). Collective: a save fails on
    every rank at the same point (`writing_together`), so the ranks can vote here."""
    try:
        yield
    except Exception:  # an OSError, or CheckpointError: files missing from the temp dir
        (moved_votes,) = all_reduce_sum([float(claim.moved())], place.env)
        if not moved_votes:
            raise
        if place.env.is_main:
            raise run_dir_moved(place.run_dir, step) from None
        raise ReportedElsewhere(EXIT_RUNTIME_FAILURE) from None


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
    every rank calls it at the same steps, and all it sums over the ranks is one all-reduce."""
    env, steps, report = run.place.env, run.steps, run.report
    shares = {"loss": float(loss_sum)} | {name: float(value) for name, value in extra_sums.items()}
    skipped = ({"bad_records_skipped": float(steps.data.skipped_records())}  # never silent
               if run.place.options.data.skip_bad_records else {})
    # Streamed records dropped or cut (the same metric names on every rank; pretokenized data
    # has none here: the pretokenizer reported them). Shown once they happen.
    policy = steps.data.policy_counts()
    # The first line also checks the memory plan printed at start-up (Adam state exists now).
    mine = {} if report.memory_measured else measure_memory(steps.ddp, steps.optimizer)
    sums, skipped_total, policy_totals, memory_totals = all_reduce_sum_lists(
        [[*shares.values()], [*skipped.values()], [float(count) for count in policy.values()],
         _rank_slots(mine, env)], env)
    counts = dict(zip(skipped, skipped_total))
    counts |= {name: int(total) for name, total in zip(policy, policy_totals) if total}
    averages = {name: total / env.world_size for name, total in zip(shares, sums)}
    if isinstance(steps.data, RolloutData):  # the round's rewards, already global
        averages |= steps.data.step_metrics()
    throughput = report.meter.report()
    stats = steps.parallel.pipeline_stats()
    if stats is not None:  # rank 0's idle share
        counts.update(bubble_theory=stats.bubble_theory, bubble_measured=stats.bubble_measured)
    report.log.log("train", steps.counters.step, **counts, lr=lr, grad_norm=grad_norm,
                skipped=not stepped, tokens=steps.counters.tokens_seen, **averages, **throughput)
    if mine:
        report.memory_measured = True
        per_rank = _per_rank(mine, memory_totals, env.world_size)
        report.log.log("memory", steps.counters.step, quiet=True, **per_rank[0], per_rank=per_rank)
    report.progress.update(steps.counters.step, throughput.get("tokens_per_sec", 0.0),
                        averages["loss"])


def _rank_slots(mine: dict[str, int], env: DistributedEnv) -> list[float]:
    """This rank's `measure_memory` in its own slots of a vector that the all-reduce sums over
    the ranks, and `_per_rank` reads back in rank order (on a grid the ranks differ: stage,
    slices, shards). Two ranks measuring {params: 10, grads: 4} and {params: 12, grads: 6}
    send [10, 4, 0, 0] and [0, 0, 12, 6]; the sum [10, 4, 12, 6] is both, in order."""
    slots = [0.0] * (len(mine) * env.world_size)
    slots[env.rank * len(mine):(env.rank + 1) * len(mine)] = map(float, mine.values())
    return slots


def _per_rank(mine: dict[str, int], summed: list[float], world_size: int
              ) -> list[dict[str, int]]:
    """`_rank_slots`' sum read back: each rank's measurement, in rank order (float64 is exact
    for byte counts below 2^53)."""
    return [dict(zip(mine, map(int, summed[rank * len(mine):(rank + 1) * len(mine)])))
            for rank in range(world_size)]


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
