"""Every option of `train_my_ddp.py`, with its default and a one-line help: they ARE the docs.

Options are grouped in one dataclass per concern (data, model, optimization, ...), and each
group is handed, typed, to the code it configures (`options.data` to the data builder,
`options.parallel` to `trainer/parallelize.py`, ...). On the command line and in saved files
they are flat (`--lr=3e-4`), since every name is unique.

The data options are the dataset layer's own `dataset.data_config.DataConfig`, the tracking
options `trainer.trackers.TrackerOptions`. Where an
option sets a field of a component with its own config (our DDP's
`DistributedDataParallelConfig`, `OptimizerConfig`, `PowerSGDState`), the default is read from
that component (`component_default`): a default exists once, and
`tests/trainer/test_parallelize.py` checks that every such option agrees with its field.
Adding an option is one field here (or in the component) plus its use.

Reading order: this file (the knobs) -> option_validation.py (ranges and combinations) ->
command_line.py (strings to values, --help) -> config_files.py (config files, --resume merge).
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from dataset.data_config import DataConfig
from model.lora import LoraConfig
from optimizer import OptimizerConfig
from parallel.distributed_data_parallel import DistributedDataParallelConfig
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import PowerSGDState
from trainer.trackers import TrackerOptions
from utils.option_checks import option


def component_default(component: type, name: str) -> Any:
    """The default of `component`'s field or constructor argument `name` (the one source)."""
    return inspect.signature(component).parameters[name].default


@dataclass
class ModelOptions:
    model_preset: str = option("tiny", "Z2allConfig preset")
    init_from: str | None = option(None, "start from a z2all checkpoint/run dir, an HF Llama "
                                   "dir or its Hub id org/name (sft/dpo: the SFT model; dpo: "
                                   "also the reference)")
    revision: str | None = option(None, "Hub branch, tag or commit of a Hub id --init_from / "
                                  "--tokenizer_dir (default: main)")
    hidden_size: int | None = option(None, "override the preset")
    num_hidden_layers: int | None = option(None, "override the preset")
    num_attention_heads: int | None = option(None, "override the preset")
    num_key_value_heads: int | None = option(None, "override the preset")
    intermediate_size: int | None = option(None, "override the preset")
    dropout: float | None = option(None, "override the preset")
    activation_checkpointing: bool = option(False, "recompute activations in backward "
                                            "(less memory, ~1/3 more compute)")


@dataclass
class OptimizationOptions:
    batch_size: int = option(8, "micro-batch size per rank")
    gradient_accumulation_steps: int = option(1, "micro-batches per optimizer step")
    max_iters: int = option(1000, "optimizer steps in the whole run (the LR schedule's horizon)")
    stop_at_iter: int | None = option(None, "end this invocation at this step with a checkpoint; "
                                      "the schedule is unchanged (for time-limited jobs)")
    lr: float = option(component_default(OptimizerConfig, "lr"), "peak learning rate")
    min_lr: float = option(6e-5, "learning rate at the end of the decay")
    lr_schedule: Literal["cosine", "linear", "constant"] = option("cosine", "decay after warmup")
    warmup_iters: int = option(100, "linear warmup steps (more than max_iters: the LR only "
                                    "warms up, never decays)")
    weight_decay: float = option(component_default(OptimizerConfig, "weight_decay"),
                                 "AdamW decoupled weight decay (not on norms/biases)")
    adam_beta1: float = option(component_default(OptimizerConfig, "adam_beta1"), "AdamW beta1")
    adam_beta2: float = option(component_default(OptimizerConfig, "adam_beta2"), "AdamW beta2")
    adam_eps: float = option(component_default(OptimizerConfig, "adam_eps"), "AdamW epsilon")
    grad_clip: float = option(component_default(OptimizerConfig, "clip_grad"),
                              "clip the global grad norm to this (0 = off)")
    seed: int = option(1337, "seed of init, data order and dropout")


@dataclass
class SystemOptions:
    device: str = option("auto", "auto | cpu | cuda (auto: cuda if available)")
    num_threads: int | None = option(None, "CPU threads per rank (default: cores // local ranks)")
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = option(
        "auto", "parameter/compute dtype (auto: on CPU bf16 only where a timed matmul runs "
        ">= 1.3x faster than fp32, see utils/precision.py; on CUDA bf16 if supported, else fp16)")
    peak_flops: float | None = option(None, "peak FLOP/s of one device for MFU (auto: known GPUs, "
                                      "else MFU is not reported)")
    initial_loss_scale: float = option(component_default(OptimizerConfig, "initial_loss_scale"),
                                       "fp16 dynamic loss scale: start")
    min_loss_scale: float = option(component_default(OptimizerConfig, "min_loss_scale"),
                                   "fp16 dynamic loss scale: floor")
    loss_scale_window: int = option(component_default(OptimizerConfig, "loss_scale_window"),
                                    "fp16: grow the scale after this many good steps")
    hysteresis: int = option(component_default(OptimizerConfig, "hysteresis"),
                             "fp16: overflows tolerated before shrinking the scale")
    compile: bool = option(False, "torch.compile each decoder block (pays on GPUs; measure on "
                           "CPU with bench/bench_model.py)")


@dataclass
class ParallelOptions:
    zero_stage: int = option(0, "ZeRO stage: 0 DDP, 1 optimizer state sharded (= "
                             "--use_distributed_optimizer), 2 + gradients, 3 + parameters")
    tensor_parallel: int = option(1, "split each matrix over this many ranks (Megatron "
                                  "column/row); data parallel = world / (tensor x pipeline x "
                                  "context)")
    pipeline_parallel: int = option(1, "split the layers into this many stages")
    context_parallel: int = option(1, "split each sequence over this many ranks (ring "
                                   "attention, load-balanced chunks; --max_seq_len a multiple "
                                   "of 2x it); composes with data/tensor/pipeline parallelism, "
                                   "every --zero_stage (sharded over dp x cp) and LoRA")
    sequence_parallel: bool = option(False, "with --tensor_parallel: shard norms/residuals "
                                     "along the sequence")
    pp_schedule: Literal["afab", "1f1b"] = option("1f1b", "pipeline schedule (micro-batches = "
                                                  "--gradient_accumulation_steps)")
    use_distributed_optimizer: bool = option(
        component_default(DistributedDataParallelConfig, "use_distributed_optimizer"),
        "an alias of --zero_stage 1 (Megatron-LM's name for ZeRO-1: the optimizer state "
        "sharded over ranks)")
    comm_hook: Literal["allreduce", "bf16", "powersgd", "overlap_optim"] = option(
        "allreduce", "how gradients are communicated")
    bucket_size: int | None = option(
        component_default(DistributedDataParallelConfig, "bucket_size"),
        "gradient bucket size in elements (none: one bucket)")
    overlap_grad_reduce: bool = option(
        component_default(DistributedDataParallelConfig, "overlap_grad_reduce"),
        "start each bucket's reduce during backward")
    overlap_param_gather: bool = option(
        component_default(OptimizerConfig, "overlap_param_gather"),
        "ZeRO-1: gather params during the next forward")
    cpu_offload: bool = option(component_default(OptimizerConfig, "cpu_offload"),
                               "ZeRO-1: keep fp32 params + Adam state on the CPU")
    grad_reduce_in_fp32: bool = option(
        component_default(DistributedDataParallelConfig, "grad_reduce_in_fp32"),
        "accumulate/reduce grads in fp32 for bf16/fp16 runs")
    powersgd_rank: int = option(component_default(PowerSGDState, "matrix_approximation_rank"),
                                "PowerSGD: rank of the low-rank gradient approximation")
    powersgd_warmup_iters: int = option(component_default(PowerSGDState, "start_powerSGD_iter"),
                                        "PowerSGD: plain allreduce for this many steps first")
    dist_timeout: float = option(30.0, "minutes a collective may wait for the slowest rank "
                                 "(rank 0 alone writes and hashes each checkpoint: size / disk "
                                 "speed, e.g. 20 GB at 100 MB/s = 3.5 min)")


@dataclass
class EvalOptions:
    eval_interval: int = option(200, "evaluate every N steps (and at the end)")
    eval_iters: int = option(20, "validation set size in global batches (a fixed set, the "
                                 "same for every split of the global batch)")
    eval_at_start: bool = option(True, "evaluate before the first step of a fresh run")
    eval_prompts: list[str] = option(["Once upon a time", "The meaning of"],
                                     "prompts sampled at each evaluation (chat-formatted for "
                                     "sft/dpo)")
    max_new_tokens: int = option(32, "tokens generated per prompt")


@dataclass
class DPOOptions:
    dpo_beta: float = option(0.1, "DPO temperature β (strength of the KL-like tie to the ref)")
    dpo_label_smoothing: float = option(0.0, "cDPO: assumed fraction of flipped preferences")
    dpo_nll_weight: float = option(0.0, "RPO: add this x the chosen answers' NLL per token, so "
                                   "their likelihood does not fall (Pang et al. 2024)")


@dataclass
class GRPOOptions:
    """GRPO (trainer/grpo_loss.py, trainer/rollouts.py): --batch_size counts completions."""

    reward_fn: str = option("", "grpo: comma list of reward functions module:function, TRL's "
                            "signature f(prompts, completions, **columns) (trainer/rewards.py;"
                            " built-ins in trainer/reward_functions.py)")
    reward_weights: str = option("", "grpo: comma list of one weight per --reward_fn "
                                 "(default 1 each)")
    num_generations: int = option(8, "grpo: completions per prompt (a group); --batch_size x "
                                  "--gradient_accumulation_steps must be a multiple of it")
    max_completion_length: int = option(32, "grpo: new tokens per completion at most")
    temperature: float = option(1.0, "grpo: sampling temperature of the rollouts (> 0)")
    top_p: float = option(1.0, "grpo: nucleus sampling of the rollouts (1 = off)")
    scale_rewards: Literal["group", "batch", "none"] = option(
        "group", "grpo: divide advantages by the group's reward std, the global batch's, or "
        "not at all (Dr. GRPO)")
    grpo_beta: float = option(0.04, "grpo: weight of the KL to the reference (0: no "
                              "reference forward)")
    grpo_epsilon: float = option(0.2, "grpo: clip the probability ratio to [1-eps, 1+eps]")
    grpo_epsilon_high: float | None = option(None, "grpo: the clip's upper eps (DAPO's "
                                             "asymmetric clip; default --grpo_epsilon)")
    grpo_loss_type: Literal["grpo", "bnpo", "dr_grpo"] = option(
        "grpo", "grpo: per-answer token mean (grpo), token mean over the batch (bnpo), or sum "
        "/ (answers x max_completion_length) (dr_grpo)")
    grpo_iterations: int = option(1, "grpo: optimizer steps on each batch of rollouts (> 1: "
                                  "the clipped ratio to the sampling policy matters)")


@dataclass
class LoraOptions:
    """LoRA fine-tuning of --init_from (model/lora.py): these build its `LoraConfig`."""

    lora_rank: int = option(component_default(LoraConfig, "rank"),
                            "LoRA: rank of each adapter (0 = off: full fine-tuning); the base "
                            "is frozen, only the adapters train and are checkpointed (with any "
                            "--zero_stage; on a tensor/pipeline grid sliced like their weights)")
    lora_alpha: float = option(component_default(LoraConfig, "alpha"),
                               "LoRA: the update is scaled by lora_alpha / lora_rank")
    lora_dropout: float = option(component_default(LoraConfig, "dropout"),
                                 "LoRA: dropout on the adapters' input (0 with "
                                 "--tensor_parallel > 1)")
    lora_targets: str = option(component_default(LoraConfig, "targets"),
                               "LoRA: comma list of HF Llama projections that get adapters")

    def config(self) -> LoraConfig | None:
        """The adapters' config, or None with LoRA off."""
        if self.lora_rank == 0:
            return None
        return LoraConfig(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets)

    def problems(self) -> list[str]:
        try:
            self.config()
        except ValueError as error:
            return [str(error)]
        return []


@dataclass
class RunOptions:
    out_dir: str = option("out/run", "run directory (config, metrics, checkpoints, report)")
    resume: bool = option(False, "continue from the newest valid checkpoint in out_dir")
    overwrite: bool = option(False, "a fresh run into an out_dir that holds another z2all run "
                             "(not a live one) moves that run aside to <out_dir>.old-<time> "
                             "(without it: refused)")
    log_interval: int = option(10, "log training metrics every N steps")
    save_interval: int = option(500, "checkpoint every N steps (and at the end)")
    keep_last: int = option(2, "checkpoints kept (plus the best by validation loss); "
                            "0 keeps all")
    verbose: bool = option(False, "also log details at start (the DDP bucket -> params map)")


GROUPS: dict[str, type] = {
    "data": DataConfig, "model": ModelOptions, "optimization": OptimizationOptions,
    "system": SystemOptions, "parallel": ParallelOptions, "eval": EvalOptions,
    "dpo": DPOOptions, "grpo": GRPOOptions, "lora": LoraOptions, "run": RunOptions,
    "tracking": TrackerOptions,
}
# Options that describe one invocation, not the run: never inherited from a saved config.
PER_INVOCATION = {"resume", "stop_at_iter", "overwrite"}
# Options you may change on --resume without breaking bitwise reproducibility.
RESUME_SAFE = {"resume", "stop_at_iter", "overwrite", "log_interval", "save_interval", "keep_last",
               "num_workers", "num_threads", "tracker", "wandb_project", "wandb_run_name",
               "out_dir", "eval_prompts",
               "max_new_tokens", "peak_flops", "eval_interval", "eval_iters", "dist_timeout",
               "verbose", "revision"}
# The grid's shape, which with the world size fixes the data-parallel size (world / (tensor x
# pipeline x context)) and so the global batch. On --resume it is inherited or given whole,
# never mixed: keeping the saved --tensor_parallel=2 under a new --pipeline_parallel=2 would
# silently halve the data-parallel size on the same ranks (trainer/config_files.py
# `_whole_grid`).
GRID_SHAPE = ("tensor_parallel", "pipeline_parallel", "context_parallel", "sequence_parallel")
# Options a resumed run cannot change: the checkpoint holds a model of that shape and a data
# position in samples of that length.
FIXED_ON_RESUME = {"task_type", "max_seq_len", "model_preset", "hidden_size",
                   "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "intermediate_size", "dropout", "lora_rank", "lora_alpha", "lora_dropout",
                   "lora_targets"}
# A LoRA run's adapters belong to its base: on --resume that is fixed too.
FIXED_ON_LORA_RESUME = FIXED_ON_RESUME | {"init_from"}
# Options naming a file or directory: equal when they name the same place, however spelled.
PATH_OPTIONS = {"data_dir", "tokenizer_dir", "init_from", "out_dir"}

OPTION_GROUP: dict[str, str] = {f.name: group for group, cls in GROUPS.items()
                                for f in fields(cls)}
OPTION_TYPES: dict[str, Any] = {name: hint for cls in GROUPS.values()
                                for name, hint in typing.get_type_hints(cls).items()}


@dataclass
class TrainingOptions:
    """All option groups, typed: `options.optimization.lr`. Flat only on disk and on the
    command line (`to_dict` / `from_dict`)."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelOptions = field(default_factory=ModelOptions)
    optimization: OptimizationOptions = field(default_factory=OptimizationOptions)
    system: SystemOptions = field(default_factory=SystemOptions)
    parallel: ParallelOptions = field(default_factory=ParallelOptions)
    eval: EvalOptions = field(default_factory=EvalOptions)
    dpo: DPOOptions = field(default_factory=DPOOptions)
    grpo: GRPOOptions = field(default_factory=GRPOOptions)
    lora: LoraOptions = field(default_factory=LoraOptions)
    run: RunOptions = field(default_factory=RunOptions)
    tracking: TrackerOptions = field(default_factory=TrackerOptions)

    def to_dict(self) -> dict[str, Any]:
        """Flat {option: value}, in the groups' order."""
        return {name: getattr(getattr(self, group), name)
                for name, group in OPTION_GROUP.items()}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingOptions:
        """From flat, already type-checked values (command_line.check_value checks them)."""
        options = cls()
        for name, value in values.items():
            setattr(getattr(options, OPTION_GROUP[name]), name, value)
        return options

    def diff_from_defaults(self) -> dict[str, Any]:
        defaults = TrainingOptions().to_dict()
        return {k: v for k, v in self.to_dict().items() if v != defaults[k]}


def default_value(name: str) -> Any:
    """The default of option `name` (for --help and the docs' table)."""
    spec = next(f for f in fields(GROUPS[OPTION_GROUP[name]]) if f.name == name)
    return spec.default if spec.default is not MISSING else spec.default_factory()


def help_text(name: str) -> str:
    spec = next(f for f in fields(GROUPS[OPTION_GROUP[name]]) if f.name == name)
    return spec.metadata["help"]
