"""Train a z2all model: pretraining, SFT or DPO, on 1 CPU process or N GPUs, with our own DDP.

    python train_my_ddp.py --task_type=pretrain --data_dir=... --out_dir=out/run1
    torchrun --nproc_per_node=8 train_my_ddp.py exp_config.py --use_distributed_optimizer
    python train_my_ddp.py --resume --out_dir=out/run1          # newest valid checkpoint
    python train_my_ddp.py --help                               # every option, grouped

Reading tour: the trainer's parts are in trainer/ (its __init__ gives the order; the options
are in trainer/config.py); this file wires them and holds the loop. One optimizer step is

    for each of gradient_accumulation_steps micro-batches:   (no_sync() on all but the last,
        loss = forward_step(batch)                             so gradients are reduced once)
        backward(loss / accumulation)
    ddp.finish_grad_sync()       # gradients averaged over ranks (ZeRO-1: reduce-scattered)
    optimizer.step()             # clip, AdamW (ZeRO-1: on this rank's shard, then all-gather)

Only `forward_step` differs between tasks: pretraining and SFT minimise next-token cross
entropy (SFT's labels are -100 outside the assistant's answers); DPO compares the policy's and
a frozen reference model's log-probabilities of a chosen and a rejected answer (utils/dpo.py).
The effective batch is batch_size × gradient_accumulation_steps × world_size sequences.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from dataset.build import build_datasets, build_stream_datasets
from dataset.sampler import StatefulDistributedSampler
from model.kernels import kernel_choices
from model.loading import load_model
from optimizer.adamw import adamw_implementation
from tokenizer import load_tokenizer
from trainer.config import Config, config_from_argv, save_config
from trainer.distributed_env import (
    DistributedEnv,
    all_reduce_sum,
    broadcast_from_main,
    init_distributed,
    shutdown_distributed,
)
from trainer.evaluation import (
    eval_loader,
    evaluate_language_model,
    evaluate_with_forward_step,
    generate_samples,
    to_device,
)
from trainer.lr_schedule import LRSchedule
from trainer.metrics import MetricsLogger
from trainer.model_setup import build_model
from trainer.optimizer_setup import build_ddp_and_optimizer
from trainer.report import write_report
from trainer.rng_state import seed_everything
from trainer.throughput import ThroughputMeter
from trainer.training_checkpoint import (
    restore_training_checkpoint,
    save_training_checkpoint,
)
from utils.checkpoint import (
    CheckpointError,
    DamagedCheckpointWarning,
    list_checkpoints,
    valid_checkpoints,
)
from utils.cli_errors import run_main
from utils.dpo import chosen_answer_nll, dpo_loss, sequence_log_prob
from utils.log_setup import configure_logging
from utils.parent_death import die_with_parent
from utils.precision import DTYPES, resolve_dtype
from utils.run_directory import RunDirInUse, RunLock, write_heartbeat

# --------------------------------------------------------------------------- forward steps

def forward_language_model(model: Any, batch: dict[str, torch.Tensor]
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pretraining and SFT: mean cross entropy over the target tokens (labels != -100)."""
    output = model(batch["input_ids"], labels=batch["labels"],
                   attention_mask=batch.get("attention_mask"))
    return output.loss, {}


def forward_dpo(model: Any, batch: dict[str, torch.Tensor], *, reference: torch.nn.Module,
                beta: float, label_smoothing: float, nll_weight: float
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO: chosen and rejected go through the policy as one batch of 2B sequences (the
    collator pads both sides to one length). `model.module.token_log_probs` skips DDP's
    forward, which is a plain pass-through: our DDP hooks the parameters, not the forward."""
    pair = {key: torch.cat([batch[f"chosen_{key}"], batch[f"rejected_{key}"]])
            for key in ("input_ids", "labels", "attention_mask")}
    policy_token_logps = model.module.token_log_probs(**pair)
    policy_logps = sequence_log_prob(policy_token_logps)
    with torch.no_grad():
        reference_logps = sequence_log_prob(reference.token_log_probs(**pair))
    half = batch["chosen_input_ids"].shape[0]
    out = dpo_loss(policy_logps[:half], policy_logps[half:], reference_logps[:half],
                   reference_logps[half:], beta=beta, label_smoothing=label_smoothing)
    chosen_nll = chosen_answer_nll(policy_token_logps[:half], batch["chosen_labels"])
    return out.loss + nll_weight * chosen_nll, {
        "dpo_loss": out.loss, "chosen_nll": chosen_nll,
        "rewards/chosen": out.chosen_rewards.mean(),
        "rewards/rejected": out.rejected_rewards.mean(),
        "rewards/accuracies": out.reward_accuracy, "rewards/margins": out.reward_margin}


# --------------------------------------------------------------------------- stop signals

class StopSignal:
    """While active, SIGTERM / SIGINT / SIGHUP only set a flag: the loop finishes the step, all
    ranks agree to stop, save a checkpoint and exit with 128 + signal (so a supervisor knows the
    run is not finished). SIGHUP is what a run started over ssh gets when the connection (or
    `monitor_process.py --remote`) goes away. The flag is read after each step, so a very
    long step delays the stop: a second signal ends the process at once, by the signal's
    default action (the newest checkpoint is intact; `monitor_process.py` sends it, or
    SIGKILL, after `--kill_grace`). A repeat within REPEAT_GRACE_S is the same request, not a
    second one: under torchrun a supervisor's SIGTERM reaches each rank twice, directly and
    forwarded by the agent. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    REPEAT_GRACE_S = 1.0

    def __enter__(self) -> StopSignal:
        self.received: int | None = None
        self._received_at = 0.0
        self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received, self._received_at = signum, time.monotonic()
        elif time.monotonic() - self._received_at > self.REPEAT_GRACE_S:
            signal.signal(signum, signal.SIG_DFL)  # asked again: stop now, mid-step
            os.kill(os.getpid(), signum)


# --------------------------------------------------------------------------- the run

def kernel_line(cfg: Config, model: torch.nn.Module, env: DistributedEnv, dtype_name: str
                ) -> str:
    """Which implementation runs each hot op and the optimizer, and why not a faster one."""
    choices = kernel_choices(env.device, DTYPES[dtype_name], model.config.head_dim)
    optimizer_device = torch.device("cpu") if cfg.cpu_offload else env.device
    choices["adamw"] = adamw_implementation(optimizer_device)
    choices["torch.compile"] = "on" if cfg.compile else "off"
    return "kernels: " + ", ".join(f"{op}={impl}" for op, impl in choices.items())


def train(cfg: Config, notes: list[str], env: DistributedEnv, stop_signal: StopSignal) -> int:
    run_dir = Path(cfg.out_dir)
    # Rank 0 decides (on a CPU `auto` times fp32 vs bf16) and every rank follows: ranks that
    # measured alike on a busy machine could still disagree, and then their grads would not mix.
    precision = broadcast_from_main(resolve_dtype(cfg.dtype, env.device)
                                    if env.is_main else None, env)
    dtype_name = precision.dtype
    log = MetricsLogger(run_dir, enabled=env.is_main, tensorboard=cfg.tensorboard)

    # Resume point: rank 0 verifies the checkpoints, newest first, and names one to every rank.
    resume_candidates = valid_checkpoints(run_dir) if cfg.resume and env.is_main else iter(())
    resume_dir = _next_resume_dir(resume_candidates, cfg, env)
    if env.is_main:
        print(precision.reason, flush=True)
        save_config(cfg, run_dir, resolved={"precision": dataclasses.asdict(precision)})
        for note in notes:
            print(note, flush=True)

    # Data: each rank reads its own disjoint positions of one global, seeded order.
    # --data_format=stream: raw shards, tokenized by DataLoader workers; its position is saved
    # per rank (dataset/stream.py) instead of the sampler's.
    tokenizer = load_tokenizer(cfg.tokenizer_dir)
    stream, sampler = None, None
    if cfg.data_format == "stream":
        stream, valid_dataset, collate_fn = build_stream_datasets(
            cfg.task_type, cfg.data_dir, cfg.tokenizer_dir, cfg.max_seq_len, cfg.seed,
            batch_size=cfg.batch_size, valid_samples=cfg.eval_iters * cfg.batch_size
            * env.world_size, data_mix=cfg.data_mix, rank=env.rank, world_size=env.world_size,
            num_workers=cfg.num_workers, shuffle_buffer=cfg.shuffle_buffer,
            skip_bad_records=cfg.skip_bad_records)
    else:
        train_dataset, valid_dataset, collate_fn = build_datasets(
            cfg.task_type, cfg.data_dir, cfg.tokenizer_dir, cfg.max_seq_len, seed=cfg.seed,
            pack_samples=cfg.pack_samples)
        sampler = StatefulDistributedSampler(len(train_dataset), env.rank, env.world_size,
                                             cfg.seed)
    global_batch = cfg.batch_size * cfg.gradient_accumulation_steps * env.world_size

    forward_step = forward_language_model
    if cfg.task_type == "dpo":
        # The reference is the SFT model we started from: always `init_from`, never a copy of
        # the policy (after a resume the policy has moved on).
        reference = load_model(cfg.init_from)[0].to(env.device, DTYPES[dtype_name]).eval()
        reference.requires_grad_(False)
        forward_step = functools.partial(forward_dpo, reference=reference, beta=cfg.dpo_beta,
                                         label_smoothing=cfg.dpo_label_smoothing,
                                         nll_weight=cfg.dpo_nll_weight)
    schedule = LRSchedule(cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.max_iters, cfg.lr_schedule)

    # Model -> our DDP -> optimizer (-> the resumed state). A checkpoint that verifies but does
    # not load on every rank (e.g. an optimizer state of another kind) is skipped with a
    # warning, and the next older one is tried.
    while True:
        seed_everything(cfg.seed)  # all ranks alike, so they build identical weights
        build = functools.partial(build_model, cfg, len(tokenizer), resume_dir)
        model, error = _on_every_rank(build, env) if resume_dir else (build(), None)
        if error is None:
            model = model.to(env.device, DTYPES[dtype_name])
            if cfg.compile:
                model.compile_blocks()
            ddp, optimizer, comm_hook_state = build_ddp_and_optimizer(cfg, model, dtype_name)
            seed_everything(cfg.seed + env.rank)  # dropout differs per rank, reproducibly
            if resume_dir is not None:
                state, error = _on_every_rank(functools.partial(
                    restore_training_checkpoint, resume_dir, env, optimizer=optimizer,
                    sampler=sampler, stream=stream, comm_hook_state=comm_hook_state,
                    seed=cfg.seed), env)
        if error is None:
            break
        if env.is_main:
            warnings.warn(f"skipping checkpoint {resume_dir}: its state does not load: {error}",
                          DamagedCheckpointWarning, stacklevel=1)
        resume_dir = _next_resume_dir(resume_candidates, cfg, env)

    # Counters and state, fresh or from the checkpoint. consumed_samples is counted, not
    # derived from step x global batch, so a resume with another world size or batch size
    # continues the data order where it stopped.
    step, tokens_seen, consumed_samples = 0, 0, 0
    if resume_dir is not None:
        step, tokens_seen = state["step"], state["tokens_seen"]
        consumed_samples = state["consumed_samples"]
        log.log("resume", step, checkpoint=str(resume_dir))
    # A dedicated generator: creating a DataLoader iterator draws a seed from it, and that
    # draw must not shift the global RNG streams between a continuous and a resumed run.
    if stream is not None:
        train_batches = iter(stream)
    else:
        train_batches = iter(DataLoader(
            train_dataset, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collate_fn,
            num_workers=cfg.num_workers, pin_memory=env.device.type == "cuda",
            generator=torch.Generator().manual_seed(cfg.seed + step)))
    valid_batches = eval_loader(valid_dataset, collate_fn, cfg.batch_size, cfg.eval_iters, env)
    num_params = sum(p.numel() for p in model.parameters())
    kernels = kernel_line(cfg, model, env, dtype_name)
    log.log("run", step, quiet=True, effective_batch=global_batch, world_size=env.world_size,
            dtype=dtype_name, device=str(env.device), num_params=num_params, kernels=kernels)
    if env.is_main:
        print(f"effective batch: {cfg.batch_size} x {cfg.gradient_accumulation_steps} x "
              f"{env.world_size} = {global_batch} sequences | {dtype_name} on {env.device} | "
              f"{num_params:,} params", flush=True)
        print(kernels, flush=True)

    def evaluate() -> dict[str, Any]:
        model.eval()
        if cfg.task_type == "dpo":
            metrics = evaluate_with_forward_step(functools.partial(forward_step, ddp),
                                                 valid_batches, env)
        else:
            metrics = evaluate_language_model(ddp, valid_batches, tokenizer, env)
        if env.is_main and cfg.eval_prompts:
            samples = generate_samples(model, tokenizer, cfg.eval_prompts,
                                       chat=cfg.task_type != "pretrain",
                                       max_new_tokens=cfg.max_new_tokens, device=env.device)
            log.log("samples", step, quiet=True, samples=samples)
            for sample in samples:
                print(f"  [sample] {sample['prompt']!r} -> {sample['completion']!r}")
        model.train()
        return metrics

    def save(val_loss: float | None) -> Path:
        optimizer.finish_param_sync()  # ZeRO-1's overlapped all-gather: wait for the weights
        # The last update may have made them NaN even from a finite loss (e.g. --lr=inf):
        # such weights never become a checkpoint. Every rank holds the same weights.
        if not all(torch.isfinite(param).all() for param in model.parameters()):
            log.close()
            raise SystemExit(_divergence_error(step, "the weights are not finite", run_dir))
        return save_training_checkpoint(
            env, run_dir / "ckpt", step, model=model, optimizer=optimizer,
            trainer_state={"step": step, "tokens_seen": tokens_seen,
                           "consumed_samples": consumed_samples,
                           "sampler": sampler and sampler.state_dict_at(consumed_samples),
                           "config": cfg.to_dict()},
            comm_hook_state=comm_hook_state and comm_hook_state.state_dict(),
            keep_last=cfg.keep_last, val_loss=val_loss,
            data_state=stream and stream.state_dict())

    # ------------------------------------------------------------------ the training loop
    stop_step = min(cfg.stop_at_iter or cfg.max_iters, cfg.max_iters)
    meter = ThroughputMeter(model, cfg.max_seq_len, dtype_name, cfg.peak_flops, env)
    stop_requested = False
    extra_log: dict[str, float] = {}
    if cfg.eval_at_start and resume_dir is None:
        log.log("eval", step, **evaluate())  # the untrained baseline (about ln(vocab))
    model.train()
    if env.is_main:
        write_heartbeat(run_dir, step)
    while step < stop_step:
        meter.start_step()
        lr = schedule(step)
        optimizer.set_lr(lr)
        optimizer.zero_grad()
        loss_sum = torch.zeros((), device=env.device)
        extra_sums: dict[str, torch.Tensor] = {}
        for micro_step in range(cfg.gradient_accumulation_steps):
            batch = to_device(next(train_batches), env.device)
            last_micro_step = micro_step == cfg.gradient_accumulation_steps - 1
            with contextlib.nullcontext() if last_micro_step else ddp.no_sync():
                loss, extras = forward_step(ddp, batch)
                optimizer.scale_loss(loss / cfg.gradient_accumulation_steps).backward()
            loss_sum += loss.detach().float()
            for key, value in extras.items():
                extra_sums[key] = extra_sums.get(key, 0.0) + value.detach().float()
            meter.count_batch(batch)
        ddp.finish_grad_sync()
        stepped, grad_norm = optimizer.step()
        step += 1
        consumed_samples += global_batch
        # One small all-reduce per step: did any rank get a stop signal or a non-finite loss,
        # and the step's tokens.
        stop_votes, nonfinite_votes, step_tokens = all_reduce_sum(
            [float(stop_signal.received is not None), float(not torch.isfinite(loss_sum)),
             meter.local_step_tokens], env)
        stop_requested = stop_votes > 0
        # Diverged: the weights are (or are about to be) NaN, and every later step and
        # checkpoint would be too. fp16's loss scaler instead skips such a step and retries.
        diverged = dtype_name != "fp16" and (nonfinite_votes > 0 or not math.isfinite(grad_norm))
        tokens_seen += int(step_tokens)
        meter.end_step(step_tokens, ddp.comm_bytes_last_step)
        if env.is_main:
            write_heartbeat(run_dir, step)

        if step % cfg.log_interval == 0 or step == stop_step or stop_requested or diverged:
            names = ["loss", *extra_sums]
            averages = all_reduce_sum([float(loss_sum), *map(float, extra_sums.values())], env)
            per_step = cfg.gradient_accumulation_steps * env.world_size
            if stream is not None and cfg.skip_bad_records:  # counted, never silent
                (extra_log["bad_records_skipped"],) = all_reduce_sum(
                    [float(stream.skipped_records())], env)
            log.log("train", step, **extra_log, lr=lr, grad_norm=grad_norm, skipped=not stepped,
                    tokens=tokens_seen, **{n: a / per_step for n, a in zip(names, averages)},
                    **meter.report())

        if diverged:
            log.close()
            raise SystemExit(_divergence_error(step, f"the loss or gradient norm is not finite "
                                                     f"(grad_norm={grad_norm})", run_dir))
        finished = step == stop_step or stop_requested
        val_loss = None
        if step % cfg.eval_interval == 0 or finished:
            metrics = evaluate()
            val_loss = metrics["val_loss"]
            log.log("eval", step, **metrics)  # `ckpt/best` follows the manifests' val_loss
        if step % cfg.save_interval == 0 or finished:
            path = save(val_loss)
            if env.is_main:
                print(f"saved checkpoint {path}", flush=True)
        if stop_requested:
            break

    if env.is_main:
        environment = {"device": str(env.device), "world_size": env.world_size,
                       "precision": precision.reason, "threads_per_rank": torch.get_num_threads(),
                       "kernels": kernels.removeprefix("kernels: ")}
        report = write_report(run_dir, cfg, environment, meter.summary(), tokenizer.fingerprint)
        print(f"report: {report}", flush=True)
    log.close()
    if stop_requested:
        name = signal.Signals(stop_signal.received or signal.SIGTERM).name
        print(f"stopped by {name} at step {step} (checkpoint saved)", flush=True)
        return 128 + (stop_signal.received or signal.SIGTERM)
    return 0


def _divergence_error(step: int, what: str, run_dir: Path) -> str:
    newest = list_checkpoints(run_dir / "ckpt")
    return (f"error: step {step}: {what}; stopped without saving. Newest checkpoint: "
            f"{newest[-1][1] if newest else 'none'}. Lower --lr, or check the data.")


def _next_resume_dir(candidates: Iterator[Path], cfg: Config, env: DistributedEnv
                     ) -> Path | None:
    """The next valid checkpoint to try (rank 0's pick, on every rank); None without --resume.
    A CheckpointError says why when none is left. Damaged ones warn."""
    if not cfg.resume:
        return None
    resume_dir, problem = None, None
    if env.is_main:
        try:
            resume_dir = next(candidates)
        except StopIteration:
            problem = "no valid checkpoint loads (see the warnings above)"
        except CheckpointError as error:
            problem = str(error)
    resume_dir, problem = broadcast_from_main((resume_dir, problem), env)
    if problem:
        raise CheckpointError(f"--resume: {problem}")  # bad input: exit code 2
    return resume_dir


def _on_every_rank(load: Callable[[], Any], env: DistributedEnv) -> tuple[Any, str | None]:
    """(load(), None) when it succeeded on every rank, else (None, why): all ranks agree, so
    they all go on to the next checkpoint together. Errors of a file that does not load are
    caught; anything else (a bug) propagates."""
    result, error = None, None
    try:
        result = load()
    except (CheckpointError, OSError, ValueError, KeyError, RuntimeError) as exception:
        error = f"{type(exception).__name__}: {exception}"
    failed_ranks = all_reduce_sum([float(error is not None)], env)[0]
    if error is None and failed_ranks:
        error = f"it failed on {int(failed_ranks)} other rank(s)"
    return (result, None) if error is None else (None, error)


@contextlib.contextmanager
def exclusive_run_dir(run_dir: str, env: DistributedEnv) -> Iterator[list[str]]:
    """Rank 0 holds the run dir's lock (utils/run_directory.py) while the run lasts; every rank
    exits at once when another live trainer holds it. Yields notes to print."""
    lock = RunLock(run_dir) if env.is_main else None
    note, problem = None, None
    if lock is not None:
        try:
            note = lock.acquire()
        except (RunDirInUse, OSError) as error:  # every rank must hear of it, or they wait
            problem = str(error)
    problem = broadcast_from_main(problem, env)
    if problem:
        raise SystemExit(f"error: {problem}")
    try:
        yield [note] if note else []
    finally:
        if lock is not None:
            lock.release()


def main(argv: list[str] | None = None) -> int:
    cfg, notes = config_from_argv(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank under torchrun: see the README's Guarantees
        die_with_parent(signal.SIGKILL)
    env = init_distributed(cfg.device, cfg.num_threads, timeout_s=60 * cfg.dist_timeout)
    configure_logging(cfg.verbose, env.is_main)
    try:
        with exclusive_run_dir(cfg.out_dir, env) as lock_notes, StopSignal() as stop_signal:
            return train(cfg, notes + lock_notes, env, stop_signal)
    finally:
        shutdown_distributed(env)


if __name__ == "__main__":
    sys.exit(run_main(main))
