"""Everything a training run is made of, built from the options in one place: `build_run`.

    run = build_run(options, env, notes, init)   # precision, data, model, DDP + optimizer, resume
    ... the loop in train_my_ddp.py steps run.steps.ddp / .optimizer on batches of .data ...

The order of the build, and why:
1. the resume point: rank 0 verifies the run's checkpoints, newest first, and names one to every
   rank (refused at once if its optimizer state is of a layout this run cannot read);
2. precision: rank 0 decides (on a CPU `auto` times fp32 vs bf16) and every rank follows, since
   ranks that measured alike on a busy machine could still disagree, and then their gradients
   would not mix (the two decisions of rank 0, one after the other, before any work); then the
   tokenizer, refused if it is not the model's (trainer/model_setup.py): only then does rank 0
   keep its copy in the run, and, once the trackers are open, write the run's config (a failed
   start must not overwrite them);
3. data (dataset/train_data.py: one interface for both --data_format), the task's forward step,
   the LR schedule;
4. model (with --lora_rank: the frozen base + adapters) -> parallelize (our DDP, optimizer,
   comm hook: trainer/parallelize.py, where other parallelism plans plug in) -> the resumed
   state. A checkpoint that verifies but does not
   load on every rank (e.g. an optimizer state of another kind) is skipped with a warning, and
   the next older one is tried;
5. counters, evaluation, throughput meter, and the start-up lines of the log.
Between 3 and 4 each rank's memory plan is compared with what its device or host has
(trainer/memory_fit.py): rank 0 warns before the model takes any memory if it cannot fit.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from dataset.build import validation_note
from dataset.train_data import TrainData, build_train_data
from model.kernels import kernel_choices
from model.lora import apply_lora
from model.modeling_z2all import Z2allForCausalLM, kernels_already_reported
from model.run_tokenizer import save_run_tokenizer
from optimizer import TrainingOptimizer
from optimizer.adamw import adamw_implementation
from optimizer.optimizer import DataParallelModel
from parallel.context_parallel.flash_blocks import ring_kernel
from trainer.config_files import save_config
from trainer.data_share import DataShare, data_share, saved_data_leader_ranks
from trainer.distributed_env import DistributedEnv, broadcast_from_main, loaded_on_every_rank
from trainer.evaluation import Evaluator, eval_loader
from trainer.forward_steps import ForwardStep, build_forward_step, build_reference
from trainer.lr_schedule import LRSchedule
from trainer.memory_fit import MemoryBudget, memory_plan
from trainer.metrics import MetricsLogger
from trainer.model_setup import (
    ModelSource,
    build_model,
    planned_model_config,
    resumed_source,
    run_tokenizer,
)
from trainer.options import TrainingOptions
from trainer.parallelize import ParallelRun, parallelize
from trainer.progress import TrainingProgress
from trainer.rng_state import seed_everything
from trainer.rollouts import RewardEvaluator, build_rollouts
from trainer.throughput import ThroughputMeter, whole_shape
from trainer.trackers import Trackers
from trainer.training_checkpoint import restore_training_checkpoint
from utils.checkpoint import CheckpointError, DamagedCheckpointWarning, valid_checkpoints
from utils.precision import DTYPES, PrecisionChoice, resolve_dtype
from utils.tokenizer_protocol import Tokenizer


@dataclass
class Counters:
    """Where the run stands. consumed_samples is counted, not derived from step x global
    batch, so a resume with another world size or batch size continues the data order where it
    stopped."""

    step: int = 0
    tokens_seen: int = 0
    consumed_samples: int = 0


@dataclass
class RunPlace:
    """Where the run is and what it was made from: read by checkpoints and the report."""

    options: TrainingOptions
    env: DistributedEnv
    run_dir: Path
    precision: PrecisionChoice
    tokenizer: Tokenizer
    resumed_from: Path | None
    lora_base: dict[str, str] | None = None  # LoRA: the frozen base's reference, for checkpoints


@dataclass
class Stepping:
    """What the loop steps: the model, spread over ranks with its optimizer, the schedule, the
    task's forward step, the data and where the run stands."""

    model: Z2allForCausalLM
    parallel: ParallelRun
    schedule: LRSchedule
    forward_step: ForwardStep
    data: TrainData  # GRPO: RolloutData, the policy's own answers (trainer/rollouts.py)
    counters: Counters
    share: DataShare
    global_batch: int  # sequences per optimizer step: batch x accumulation x data-parallel size

    @property
    def ddp(self) -> DataParallelModel:
        return self.parallel.ddp

    @property
    def optimizer(self) -> TrainingOptimizer:
        return self.parallel.optimizer


@dataclass
class Reporting:
    """What the run logs and shows: metrics.jsonl (and trackers), throughput, the progress line,
    the evaluator, the kernel line."""

    log: MetricsLogger
    meter: ThroughputMeter
    progress: TrainingProgress
    evaluator: Evaluator | RewardEvaluator
    kernels: str
    memory_measured: bool = False  # measure_memory logged after the first step

    @property
    def stop_step(self) -> int:
        """Where this invocation ends: --stop_at_iter, else the schedule's --max_iters."""
        return self.progress.total_steps


@dataclass
class Run:
    """A training run, built and ready to step (see the module docstring), in three parts."""

    place: RunPlace
    steps: Stepping
    report: Reporting


def build_run(options: TrainingOptions, env: DistributedEnv, notes: list[str],
              init: ModelSource | None, budget: MemoryBudget | None = None) -> Run:
    """`init`: the --init_from model as `check_init_from` resolved it (None without one, or
    on --resume). `budget` (trainer/memory_fit.py) gets this rank's memory plan and limit
    before the model is built; rank 0 warns if its plan does not fit."""
    run_dir = Path(options.run.out_dir)
    data_options, optimization = options.data, options.optimization
    resume_candidates = (valid_checkpoints(run_dir) if options.run.resume and env.is_main
                         else iter(()))
    resume_dir = _next_resume_dir(resume_candidates, options.run.resume, env)
    precision = broadcast_from_main(resolve_dtype(options.system.dtype, env.device)
                                    if env.is_main else None, env)
    source = resumed_source(run_dir, resume_dir) or init
    tokenizer = run_tokenizer(data_options, source)
    if env.is_main:  # the model's tokenizer, checked: the run keeps its copy
        save_run_tokenizer(tokenizer, run_dir)
    trackers = Trackers(options.tracking, run_dir, config=options.to_dict(), enabled=env.is_main)
    log = MetricsLogger(run_dir, enabled=env.is_main, trackers=trackers)
    if env.is_main:
        print(precision.reason, flush=True)
        save_config(options, run_dir, resolved={"precision": dataclasses.asdict(precision)})
        for note in notes:
            print(note, flush=True)

    parallel_options = options.parallel
    share = data_share(env.rank, env.world_size, parallel_options.tensor_parallel,
                       parallel_options.pipeline_parallel, parallel_options.context_parallel)
    # --eval_iters global batches: the same validation set for every split of one global batch
    eval_samples = options.eval.eval_iters * (optimization.batch_size * share.world_size
                                              * optimization.gradient_accumulation_steps)
    if data_options.task_type == "grpo":  # the policy's own answers: trainer/rollouts.py
        data, evaluator = build_rollouts(options, tokenizer, env)
    else:
        data, valid_dataset, collate_fn = build_train_data(
            data_options, tokenizer, seed=optimization.seed, batch_size=optimization.batch_size,
            eval_samples=eval_samples, rank=share.rank, world_size=share.world_size,
            pin_memory=env.device.type == "cuda", sequence_multiple=share.sequence_multiple)
    schedule = LRSchedule(optimization.lr, optimization.min_lr, optimization.warmup_iters,
                          optimization.max_iters, optimization.lr_schedule)
    budget = budget or MemoryBudget(env.rank)
    planned_config = planned_model_config(options.model, data_options.max_seq_len, tokenizer,
                                          source)
    budget.measure(memory_plan(options, planned_config, env.world_size, env.rank,
                               precision.dtype).total, env)
    if env.is_main and data_options.task_type != "grpo":  # the validation set's size and source
        print(validation_note(data_options, len(valid_dataset), eval_samples), flush=True)
    (model, lora_base), parallel, saved_state, resume_dir = _model_and_resume_point(
        options, env, precision.dtype, tokenizer, data, resume_candidates, resume_dir, init)
    kernels = kernel_line(options, model, env, precision.dtype)  # for the start-up lines
    reference = functools.partial(build_reference, options.model.init_from, env.device,
                                  precision.dtype, lora=options.lora.config() is not None,
                                  split_reference=parallel.split_like_policy,
                                  base_of_policy=parallel.base_of_policy)
    forward_step = build_forward_step(data_options.task_type, options.dpo, options.grpo,
                                      reference)
    if data_options.task_type == "grpo":
        data.use_policy(parallel, reference() if options.grpo.grpo_beta else None)

    counters = Counters()
    if saved_state is not None:
        counters = Counters(saved_state["step"], saved_state["tokens_seen"],
                            saved_state["consumed_samples"])
    if data_options.task_type != "grpo":
        valid_loader = eval_loader(valid_dataset, collate_fn, optimization.batch_size,
                                   eval_samples, dataclasses.replace(env, rank=share.rank,
                                                                     world_size=share.world_size))
        evaluator = Evaluator(valid_loader, tokenizer, forward_step, data_options.task_type,
                              options.eval, env, counts_data=share.counts_tokens)
    meter = ThroughputMeter(whole_shape(model.config), data_options.max_seq_len, precision.dtype,
                            options.system.peak_flops, env)
    stop_step = min(optimization.stop_at_iter or optimization.max_iters, optimization.max_iters)
    progress = TrainingProgress(stop_step, start_step=counters.step, enabled=env.is_main)
    log.echo = progress.write  # the log's lines go above the bar
    global_batch = (optimization.batch_size * optimization.gradient_accumulation_steps
                    * share.world_size)
    run = Run(
        place=RunPlace(options=options, env=env, run_dir=run_dir, precision=precision,
                       tokenizer=tokenizer, resumed_from=resume_dir, lora_base=lora_base),
        steps=Stepping(model=model, parallel=parallel, schedule=schedule,
                       forward_step=forward_step, data=data, counters=counters, share=share,
                       global_batch=global_batch),
        report=Reporting(log=log, meter=meter, progress=progress, evaluator=evaluator,
                         kernels=kernels))
    _log_start(run)
    return run


def kernel_line(options: TrainingOptions, model: torch.nn.Module, env: DistributedEnv,
                dtype_name: str) -> str:
    """Which implementation runs each hot op and the optimizer, and why not a faster one."""
    choices = kernel_choices(env.device, DTYPES[dtype_name], model.config.head_dim)
    if options.parallel.context_parallel > 1:
        choices["attention"] = ring_kernel(env.device, DTYPES[dtype_name], model.config.head_dim)
    optimizer_device = torch.device("cpu") if options.parallel.cpu_offload else env.device
    choices["adamw"] = adamw_implementation(optimizer_device)
    choices["torch.compile"] = "on" if options.system.compile else "off"
    return "kernels: " + ", ".join(f"{op}={impl}" for op, impl in choices.items())


def _log_start(run: Run) -> None:
    """The run's start in metrics.jsonl (the checkpoint it resumed from, its shape), and on
    stdout for people."""
    place, steps, report = run.place, run.steps, run.report
    if place.resumed_from is not None:
        report.log.log("resume", steps.counters.step, checkpoint=str(place.resumed_from))
    shape = whole_shape(steps.model.config)
    num_params = shape.num_parameters()  # counted before apply_lora adds adapters in place
    lora = place.options.lora.config()
    trainable = (sum(p.numel() for p in apply_lora(shape, lora).parameters()
                     if p.requires_grad) if lora else num_params)
    optimization, env = place.options.optimization, place.env
    report.log.log("run", steps.counters.step, quiet=True, effective_batch=steps.global_batch,
                world_size=env.world_size, dtype=place.precision.dtype, device=str(env.device),
                num_params=num_params, trainable_params=trainable, kernels=report.kernels)
    if env.is_main:
        print(f"effective batch: {optimization.batch_size} x "
              f"{optimization.gradient_accumulation_steps} x {steps.share.world_size} = "
              f"{steps.global_batch} sequences | {place.precision.dtype} on {env.device} | "
              f"{num_params:,} params"
              + (f" ({trainable:,} trainable: LoRA)" if trainable < num_params else ""),
              flush=True)
        print(report.kernels, flush=True)
        kernels_already_reported(env.device, DTYPES[place.precision.dtype])
        _print_memory_plan(place, steps)
        if steps.parallel.context is not None:
            context = steps.parallel.context
            print(f"context parallel: each sequence over {context.size} ranks, each holding "
                  f"2 of its {2 * context.size} chunks (ring attention)", flush=True)
        if place.resumed_from is not None and steps.counters.step >= report.stop_step:
            print(f"note: the run is already at step {steps.counters.step} = --max_iters: "
                  "nothing to train; raise --max_iters to continue it", flush=True)


def _print_memory_plan(place: RunPlace, steps: Stepping) -> None:
    """Rank 0's plan; on a pipeline, each later stage's total too (the last holds the head)."""
    world_size = place.env.world_size
    plan = memory_plan(place.options, steps.model.config, world_size, 0, place.precision.dtype)
    print(f"memory plan per rank (ZeRO stage {steps.parallel.zero_stage}):\n{plan.render()}",
          flush=True)
    dims = steps.parallel.dims
    if dims.tensor_parallel * dims.pipeline_parallel == 1:
        return
    context = (f" x {dims.context_parallel} context parallel" if dims.context_parallel > 1
               else "")
    print(f"grid: {dims.pipeline_parallel} pipeline stages x {dims.data_parallel} data "
          f"parallel{context} x {dims.tensor_parallel} tensor parallel; the plan above is rank "
          "0's (stage 0)", flush=True)
    for stage in range(1, dims.pipeline_parallel):
        rank = dims.rank_of(stage, 0, 0, 0)
        total = memory_plan(place.options, steps.model.config, world_size, rank,
                            place.precision.dtype).total
        print(f"  stage {stage} (rank {rank}): total {total / 2**30:.3f} GiB  {total:,} B",
              flush=True)


def _model_and_resume_point(options: TrainingOptions, env: DistributedEnv, dtype_name: str,
                            tokenizer: Tokenizer, data: TrainData,
                            resume_candidates: Iterator[Path], resume_dir: Path | None,
                            init: ModelSource | None
                            ) -> tuple[tuple[Z2allForCausalLM, dict[str, str] | None],
                                       ParallelRun, dict | None, Path | None]:
    """((model, LoRA base reference or None), its DDP + optimizer, the resumed trainer state
    or None, the checkpoint used), trying older checkpoints while the chosen one does not load
    on every rank."""
    while True:
        seed_everything(options.optimization.seed)  # all ranks alike: identical weights
        build = functools.partial(build_model, options.model, options.data.max_seq_len,
                                  tokenizer, options.lora.config(), resume_dir, init)
        built, error = loaded_on_every_rank(build, env) if resume_dir else (build(), None)
        state = None
        if error is None:
            model, lora_base = built
            model = model.to(env.device, DTYPES[dtype_name])
            if options.system.compile:
                model.compile_blocks()
            parallel = parallelize(model, options.parallel, options.optimization,
                                   options.system, dtype_name)
            seed_everything(options.optimization.seed + env.rank)  # dropout differs per rank
            if resume_dir is not None:
                state, error = loaded_on_every_rank(functools.partial(
                    restore_training_checkpoint, resume_dir, env, optimizer=parallel.optimizer,
                    data=data, comm_hook_state=parallel.comm_hook_state,
                    seed=options.optimization.seed, data_ranks=saved_data_leader_ranks), env)
        if error is None:
            return (model, lora_base), parallel, state, resume_dir
        if env.is_main:
            warnings.warn(f"skipping checkpoint {resume_dir}: its state does not load: {error}",
                          DamagedCheckpointWarning, stacklevel=1)
        resume_dir = _next_resume_dir(resume_candidates, options.run.resume, env)


def _next_resume_dir(candidates: Iterator[Path], resume: bool, env: DistributedEnv
                     ) -> Path | None:
    """The next valid checkpoint to try (rank 0's pick, on every rank); None without --resume.
    A CheckpointError says why when none is left. Damaged ones warn."""
    if not resume:
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

