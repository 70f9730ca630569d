"""Every option in range and every combination workable, checked before any data or model is
built; all problems are reported together, in one line (`ValueError`, exit code 2)."""

from __future__ import annotations

from pathlib import Path

import torch

from model.loading import check_weight_files, model_files_at, resolve_model_dir
from optimizer.data_parallel_factory import check_zero_options
from parallel.parallel_dims import check_context_parallel_length
from parallel_plan.llama_shapes import check_parallel_shapes
from trainer.model_setup import DEMO_TOKENIZER_DIR, ModelSource, preset_model_config
from trainer.options import TrainingOptions
from utils.data_files import is_data_spec, locate_data
from utils.option_checks import raise_problems, range_problem
from utils.run_ownership import out_dir_problem

# Lower bounds of the options that only have one (unset optional options are not checked).
LOWER_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("batch_size", "gradient_accumulation_steps", "max_seq_len", "max_iters",
                     "log_interval", "eval_interval", "save_interval", "eval_iters",
                     "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "num_threads", "bucket_size",
                     "loss_scale_window", "hysteresis", "powersgd_rank", "max_new_tokens"), 1),
    **dict.fromkeys(("num_workers", "keep_last", "weight_decay", "grad_clip", "dpo_nll_weight",
                     "powersgd_warmup_iters", "shuffle_buffer"), 0),
}
MAX_SEED = 2**63 - 1  # torch.manual_seed takes a 64-bit integer
MAX_DIST_TIMEOUT = 7 * 24 * 60.0  # minutes: a week; beyond it the timedelta overflows


def check_options(options: TrainingOptions) -> None:
    """Raise one ValueError naming every bad option (see the module docstring)."""
    flat = options.to_dict()
    optimization, system = options.optimization, options.system
    problems = [range_problem(f"--{name}", flat[name], low=low)
                for name, low in LOWER_BOUNDS.items()]
    lr_problem = range_problem("--lr", optimization.lr, 0, low_open=True)
    # Bounds that are other options apply once those are valid (one message per mistake).
    problems += [
        lr_problem,
        range_problem("--min_lr", optimization.min_lr, 0, None if lr_problem else optimization.lr),
        range_problem("--adam_beta1", optimization.adam_beta1, 0, 1, high_open=True),
        range_problem("--adam_beta2", optimization.adam_beta2, 0, 1, high_open=True),
        range_problem("--adam_eps", optimization.adam_eps, 0, low_open=True),
        range_problem("--dropout", options.model.dropout, 0, 1, high_open=True),
        range_problem("--dpo_beta", options.dpo.dpo_beta, 0, low_open=True),
        range_problem("--dpo_label_smoothing", options.dpo.dpo_label_smoothing, 0, 0.5,
                      high_open=True),
        range_problem("--peak_flops", system.peak_flops, 0, low_open=True),
        range_problem("--initial_loss_scale", system.initial_loss_scale, 0, low_open=True),
        range_problem("--min_loss_scale", system.min_loss_scale, 0, system.initial_loss_scale,
                      low_open=True),
        range_problem("--warmup_iters", optimization.warmup_iters, 0),  # > max_iters: no decay
        range_problem("--stop_at_iter", optimization.stop_at_iter, 1),
        range_problem("--dist_timeout", options.parallel.dist_timeout, 0, MAX_DIST_TIMEOUT,
                      low_open=True),
        range_problem("--seed", optimization.seed, 0, MAX_SEED),
    ]
    grid_problems = _grid_problems(options)  # asked once: the split check waits on them
    problems += _combination_problems(options, grid_problems)
    problems += _fresh_model_problems(options, found=any(problems), grid_fine=not grid_problems)
    raise_problems(dict.fromkeys(problems))  # a problem two checks find is named once


def check_paths(options: TrainingOptions) -> None:
    """Every path an option names exists, and --out_dir is a directory the run may own:
    checked by the entry point right after the options, before anything is written or any
    data work starts (kept apart from `check_options`, which judges values alone, so that a
    config can be checked on another machine)."""
    paths = {"--data_dir": options.data.data_dir, "--tokenizer_dir": options.data.tokenizer_dir,
             "--init_from": options.model.init_from}
    named = options.data.data_dir if is_data_spec(options.data.data_dir) else None
    problems = [f"{flag}={path}: no such file or directory" for flag, path in paths.items()
                if path is not None and path != named and not Path(path).exists()]
    problems.append(named and _named_data_problem(named))
    run = options.run
    if not run.out_dir.strip():
        problems.append("--out_dir is empty: name the run directory, e.g. --out_dir=out/run1")
    else:  # a directory of the run's own (utils/run_ownership.py)
        default_tokenizer = (DEMO_TOKENIZER_DIR if options.data.tokenizer_dir is None
                             and options.model.init_from is None else None)
        problems.append(out_dir_problem(run.out_dir, reads={
            **paths, "the default --tokenizer_dir": default_tokenizer}))
    raise_problems(problems)


def _named_data_problem(spec: str) -> str | None:
    """Why `--data_dir hf:org/name` (or `DIR@split`) names no data files here, or None: asked
    before the run starts, as for a path (utils/data_files.py)."""
    try:
        located = locate_data(spec)
    except (ValueError, OSError) as error:
        return str(error)
    return None if located.files else f"--data_dir={spec}: no data files there"


def check_init_from(options: TrainingOptions) -> ModelSource | None:
    """The --init_from model as far as it can be read without its weights: its config (every
    value checked: model/configuration_z2all.py), the headers of its weight files (a truncated
    download is named) and --lora_rank against its shape, so a fresh run refuses a bad model
    before any work (the weights are loaded much later). On --resume the model comes from the
    run's checkpoint, which its manifest verifies, and the LoRA options and base are fixed
    (config_files.py). Returns the model so resolved, for the run to start from (None with
    no --init_from, or on --resume)."""
    if options.model.init_from is None or options.run.resume:
        return None
    # which directory holds its weights: a run's newest verified checkpoint, an HF dir, ...
    directory = resolve_model_dir(options.model.init_from)
    files = model_files_at(directory)
    check_weight_files(files.weight_files())
    lora = options.lora.config()
    if lora is not None:
        lora.check_fits(files.config)
    return ModelSource(options.model.init_from, directory, files)


def _combination_problems(options: TrainingOptions, grid_problems: list[str]) -> list[str]:
    """Options that are fine alone but cannot work together (the grid's, `_grid_problems`,
    found by the caller, among them)."""
    problems = options.data.problems() + options.tracking.problems() + options.lora.problems()
    stop_at_iter, max_iters = options.optimization.stop_at_iter, options.optimization.max_iters
    if stop_at_iter is not None and stop_at_iter > max_iters:
        problems.append(f"--stop_at_iter={stop_at_iter} is beyond --max_iters={max_iters}")
    prompts = options.eval.eval_prompts
    if any(not prompt.strip() for prompt in prompts):
        problems.append(f"--eval_prompts={prompts!r} has an empty prompt: give non-empty "
                        "prompts, or --eval_prompts=[] for none")
    if options.data.task_type == "dpo" and not options.model.init_from:
        problems.append("--task_type=dpo needs --init_from=<the SFT model>: it is both the "
                        "starting policy and the frozen reference")
    if options.lora.lora_rank > 0 and not options.model.init_from:
        problems.append("--lora_rank trains adapters on a pretrained model: add "
                        "--init_from=<the model to fine-tune> (or --lora_rank=0)")
    if options.parallel.comm_hook == "overlap_optim" and options.optimization.grad_clip > 0:
        problems.append("--comm_hook=overlap_optim updates each bucket before the others are "
                        "reduced, so it cannot clip by the global norm: add --grad_clip=0")
    parallel = options.parallel
    try:
        zero_stage = check_zero_options(parallel.zero_stage, parallel.comm_hook,
                                        parallel.use_distributed_optimizer,
                                        parallel.cpu_offload, parallel.overlap_param_gather)
    except ValueError as error:
        problems.append(str(error))
    else:
        if zero_stage == 3 and options.system.compile:
            problems.append("--compile cannot be combined with --zero_stage=3 yet (its hooks "
                            "gather and free weights around each compiled block): drop "
                            "--compile or use --zero_stage 2")
    problems += (grid_problems + _context_parallel_problems(options)
                 + _fp16_problems(options) + _grpo_problems(options))
    device = options.system.device
    if device not in ("auto", "cpu", "cuda"):
        problems.append(f"--device must be auto, cpu or cuda, got {device!r}")
    elif device == "cuda" and not torch.cuda.is_available():
        problems.append("--device=cuda but CUDA is not available here: use --device=cpu "
                        "(or auto)")
    return problems


def _grpo_problems(options: TrainingOptions) -> list[str]:
    """GRPO's values, and what it does not run on yet (refused in one line)."""
    grpo, optimization, parallel = options.grpo, options.optimization, options.parallel
    if options.data.task_type != "grpo":
        return []
    problems = [
        range_problem("--num_generations", grpo.num_generations, 2),  # a group of one: no signal
        range_problem("--max_completion_length", grpo.max_completion_length, 1,
                      options.data.max_seq_len - 1),
        range_problem("--temperature", grpo.temperature, 0, low_open=True),
        range_problem("--top_p", grpo.top_p, 0, 1, low_open=True),
        range_problem("--grpo_beta", grpo.grpo_beta, 0),
        range_problem("--grpo_epsilon", grpo.grpo_epsilon, 0, 1, low_open=True),
        range_problem("--grpo_epsilon_high", grpo.grpo_epsilon_high, 0, low_open=True),
        range_problem("--grpo_iterations", grpo.grpo_iterations, 1)]
    completions = optimization.batch_size * optimization.gradient_accumulation_steps
    if completions % grpo.num_generations:
        problems.append(f"--batch_size x --gradient_accumulation_steps = {completions} "
                        f"completions per rank is not a multiple of --num_generations="
                        f"{grpo.num_generations}: a group must stay on one rank")
    if not options.model.init_from:
        problems.append("--task_type=grpo needs --init_from=<the model to improve>: it is the "
                        "starting policy and the frozen reference")
    if not grpo.reward_fn.strip():
        problems.append("--task_type=grpo needs --reward_fn module:function (e.g. "
                        "trainer.reward_functions:exact_answer)")
    if parallel.tensor_parallel * parallel.pipeline_parallel * parallel.context_parallel > 1:
        problems.append("--task_type=grpo runs on data parallelism (any --zero_stage, LoRA) "
                        "for now: drop --tensor_parallel, --pipeline_parallel and "
                        "--context_parallel")
    if options.data.data_format == "stream":
        problems.append("--task_type=grpo reads its prompt records whole: drop "
                        "--data_format=stream")
    return [problem for problem in problems if problem]


def _fp16_problems(options: TrainingOptions) -> list[str]:
    """The one rule for --dtype=fp16, on any device: its dynamic loss scale must skip a whole
    step when any gradient overflows, which the overlapped optimizer step cannot (it updates
    each bucket before the others are reduced) and the tensor/pipeline grid does not do yet.
    (`--dtype=auto` becomes fp16 only on a CUDA GPU without bf16, once the run starts: there
    OverlappedAdamW's own check refuses it.)"""
    parallel = options.parallel
    if options.system.dtype != "fp16":
        return []
    refused = {"--comm_hook=overlap_optim": parallel.comm_hook == "overlap_optim",
               "--tensor_parallel/--pipeline_parallel > 1":
                   parallel.tensor_parallel * parallel.pipeline_parallel > 1}
    return [f"--dtype=fp16 cannot be combined with {name} (its loss scale must skip whole "
            "steps): use --dtype=bf16 or fp32" for name, on in refused.items() if on]


def _grid_problems(options: TrainingOptions) -> list[str]:
    """--tensor_parallel / --pipeline_parallel: what the grid does not support (yet). It
    takes every --zero_stage (sharded over the data-parallel group; with context parallelism
    over dp x cp), --comm_hook=bf16 and --compile."""
    parallel = options.parallel
    grid = parallel.tensor_parallel * parallel.pipeline_parallel
    problems = [problem for name in ("tensor_parallel", "pipeline_parallel")
                if (problem := range_problem(f"--{name}", getattr(parallel, name), low=1))]
    if parallel.sequence_parallel and parallel.tensor_parallel == 1:
        problems.append("--sequence_parallel needs --tensor_parallel > 1")
    if problems or grid == 1:
        return problems
    flag = (f"--tensor_parallel={parallel.tensor_parallel} "
            f"--pipeline_parallel={parallel.pipeline_parallel}")
    hook = f"--comm_hook={parallel.comm_hook}"
    unsupported = [  # (option, refused, why and what to use instead)
        (hook, parallel.comm_hook == "powersgd", "its per-rank state is not saved "
         "layout-neutral; use --comm_hook=bf16 (half the bytes) or allreduce"),
        (hook, parallel.comm_hook == "overlap_optim", "a bucket steps before the whole "
         "model's gradient norm is known; use --comm_hook=allreduce or bf16"),
        ("--cpu_offload", parallel.cpu_offload, "not tested on a grid; drop it"),
        ("--overlap_param_gather", parallel.overlap_param_gather,
         "not tested on a grid; drop it"),
        (f"--lora_dropout={options.lora.lora_dropout}",
         options.lora.lora_rank > 0 and options.lora.lora_dropout > 0
         and parallel.tensor_parallel > 1,
         "the tensor-parallel ranks would each drop other elements of the same replicated "
         "input; use --lora_dropout=0"),
    ]
    return problems + [f"{name} with {flag} is not supported yet: {why}"
                       for name, refused, why in unsupported if refused]


def _context_parallel_problems(options: TrainingOptions) -> list[str]:
    """--context_parallel: the sequence length it needs, and what it does not compose with
    yet. It takes data parallelism, --tensor_parallel (+ --sequence_parallel),
    --pipeline_parallel, every --zero_stage (sharded over the dp x cp ranks), --comm_hook=bf16,
    pretraining, SFT (padded or packed), DPO and LoRA."""
    parallel, context = options.parallel, options.parallel.context_parallel
    if problem := range_problem("--context_parallel", context, low=1):
        return [problem]
    if context == 1:
        return []
    try:
        check_context_parallel_length(options.data.max_seq_len, context)
        problems = []
    except ValueError as error:
        problems = [str(error)]
    dropout = options.model.dropout
    unsupported = [  # (option, refused, why and what to use instead)
        (f"--comm_hook={parallel.comm_hook}", parallel.comm_hook in ("powersgd", "overlap_optim"),
         "not tested with context parallelism; use --comm_hook=allreduce or bf16"),
        ("--dtype=fp16", options.system.dtype == "fp16",
         "its loss scaling is not tested with context parallelism; use --dtype=bf16 or fp32"),
        (f"--dropout={dropout}", bool(dropout), "ring attention has no dropout; use 0"),
        ("--compile", options.system.compile, "the ring's collectives are not compiled "
         "(not tested); drop it"),
    ]
    return problems + [f"{name} with --context_parallel={context} is not supported yet: {why}"
                       for name, refused, why in unsupported if refused]


def _fresh_model_problems(options: TrainingOptions, found: bool, grid_fine: bool) -> list[str]:
    """A fresh model (no --init_from): the preset with the command line's overrides, built
    once, checked as the model will check it and, on a tensor/pipeline grid, as its plan will
    split it (parallel_plan/llama_shapes.py; the vocabulary is known, and checked, once the
    tokenizer is loaded). Its shape is judged once no other problem was `found` (a bad
    --hidden_size is named once, by its range); its split on the grid as soon as the grid's own
    options are fine (`grid_fine`: `_grid_problems` found none), beside whatever else is
    wrong."""
    if options.model.init_from is not None:
        return []
    parallel = options.parallel
    grid = parallel.tensor_parallel * parallel.pipeline_parallel
    check_split = grid > 1 and grid_fine
    if found and not check_split:
        return []
    try:
        config = preset_model_config(options.model, options.data.max_seq_len, vocab_size=1)
        if check_split:
            context = max(parallel.context_parallel, 1)
            check_parallel_shapes(config, grid * context, parallel.tensor_parallel,
                                  parallel.pipeline_parallel, parallel.sequence_parallel,
                                  seq_len=options.data.max_seq_len, context_parallel=context)
    except ValueError as error:
        return [str(error) if check_split else f"model: {error}"]
    return []
