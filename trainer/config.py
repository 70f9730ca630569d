"""Every option of `train_my_ddp.py`, with its default and a one-line help: the config IS the docs.

Options are grouped in one dataclass per concern (data, model, optimization, ...); on the
command line and in saved files they are flat (`--lr=3e-4`), since every name is unique.

    python train_my_ddp.py [exp_config.py | config.json] --key=value --flag --flag=false ...

Precedence, lowest first: defaults < config file < command line. With `--resume`, the run's
saved `config.json` takes the place of the defaults (less `resume` and `stop_at_iter`, which
describe one invocation), so a resumed run continues with what it was started with, plus
whatever you pass explicitly (changes that break bitwise reproducibility are warned about).
A run saves the resolved config twice: `config.json` (machine-readable) and
`exp_config.py` (one `name = value` per line, accepted back as the config file). Both also
record what an `auto` option resolved to on this run (config.json's "resolved" entry, a
comment in exp_config.py); reading the file back ignores it, so `auto` decides afresh.
"""

from __future__ import annotations

import ast
import difflib
import json
import sys
import types
import typing
import warnings
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import torch

from trainer.model_setup import preset_model_config
from utils.atomic_io import atomic_write_json, atomic_write_text
from utils.option_checks import raise_problems, range_problem


def option(default: Any, help: str) -> Any:  # noqa: A002 - `help` reads best in the knobs below
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class DataOptions:
    task_type: Literal["pretrain", "sft", "dpo"] = option("pretrain", "what to train")
    data_dir: str = option("data/demo/pretrain_pretok", "pretokenized data (pretrain) or "
                           "raw/pretok sft/dpo data, as dataset.build.build_datasets expects")
    tokenizer_dir: str = option("tokenizer/demo_hf", "saved tokenizer (AutoTokenizer-loadable)")
    max_seq_len: int = option(256, "tokens per sample")
    pack_samples: bool = option(False, "sft: pack each batch's samples end to end into rows "
                                "of max_seq_len, attention kept within each sample "
                                "(dataset/sft_packing.py)")
    num_workers: int = option(0, "DataLoader worker processes per rank")
    data_format: Literal["pretok", "stream"] = option(
        "pretok", "pretok: .bin/.idx (+ sample index) made offline; stream: raw shards "
        "tokenized on the fly (dataset/stream.py)")
    data_mix: str = option("", "stream: weighted sources, subfolders of data_dir, "
                           "e.g. web:0.7,books:0.3 (empty: data_dir is one source)")
    shuffle_buffer: int = option(1000, "stream: samples in each rank's shuffle buffer")
    skip_bad_records: bool = option(False, "stream: skip and count malformed records "
                                    "(metrics.jsonl: bad_records_skipped) instead of stopping")


@dataclass
class ModelOptions:
    model_preset: str = option("tiny", "Z2allConfig preset")
    init_from: str | None = option(None, "start from a z2all checkpoint/run dir or an HF Llama "
                                   "dir (sft/dpo: the SFT model; dpo: also the reference)")
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
    lr: float = option(6e-4, "peak learning rate")
    min_lr: float = option(6e-5, "learning rate at the end of the decay")
    lr_schedule: Literal["cosine", "linear", "constant"] = option("cosine", "decay after warmup")
    warmup_iters: int = option(100, "linear warmup steps (more than max_iters: the LR only "
                                           "warms up, never decays)")
    weight_decay: float = option(0.1, "AdamW decoupled weight decay (not on norms/biases)")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.95, "AdamW beta2")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    grad_clip: float = option(1.0, "clip the global grad norm to this (0 = off)")
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
    initial_loss_scale: float = option(2.0 ** 16, "fp16 dynamic loss scale: start")
    min_loss_scale: float = option(1.0, "fp16 dynamic loss scale: floor")
    loss_scale_window: int = option(1000, "fp16: grow the scale after this many good steps")
    hysteresis: int = option(2, "fp16: overflows tolerated before shrinking the scale")
    compile: bool = option(False, "torch.compile each decoder block (pays on GPUs; measure on "
                           "CPU with bench/bench_model.py)")


@dataclass
class ParallelOptions:
    use_distributed_optimizer: bool = option(False, "ZeRO-1: shard optimizer states over ranks")
    comm_hook: Literal["allreduce", "bf16", "powersgd", "overlap_optim"] = option(
        "allreduce", "how gradients are communicated")
    bucket_size: int | None = option(None, "gradient bucket size in elements (None: one bucket)")
    overlap_grad_reduce: bool = option(False, "start each bucket's reduce during backward")
    overlap_param_gather: bool = option(False, "ZeRO-1: gather params during the next forward")
    cpu_offload: bool = option(False, "ZeRO-1: keep fp32 params + Adam state on the CPU")
    grad_reduce_in_fp32: bool = option(True, "accumulate/reduce grads in fp32 for bf16/fp16 runs")
    powersgd_rank: int = option(4, "PowerSGD: rank of the low-rank gradient approximation")
    powersgd_warmup_iters: int = option(10, "PowerSGD: plain allreduce for this many steps first")
    dist_timeout: float = option(30.0, "minutes a collective may wait for the slowest rank "
                                 "(rank 0 alone writes and hashes each checkpoint: size / disk "
                                 "speed, e.g. 20 GB at 100 MB/s = 3.5 min)")


@dataclass
class EvalOptions:
    eval_interval: int = option(200, "evaluate every N steps (and at the end)")
    eval_iters: int = option(20, "validation batches per evaluation (a fixed set)")
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
class RunOptions:
    out_dir: str = option("out/run", "run directory (config, metrics, checkpoints, report)")
    resume: bool = option(False, "continue from the newest valid checkpoint in out_dir")
    log_interval: int = option(10, "log training metrics every N steps")
    save_interval: int = option(500, "checkpoint every N steps (and at the end)")
    keep_last: int = option(2, "checkpoints kept (plus the best by validation loss); "
                            "0 keeps all")
    tensorboard: bool = option(True, "also log to TensorBoard if it is installed")
    verbose: bool = option(False, "also log details at start (the DDP bucket -> params map)")


GROUPS: dict[str, type] = {
    "data": DataOptions, "model": ModelOptions, "optimization": OptimizationOptions,
    "system": SystemOptions, "parallel": ParallelOptions, "eval": EvalOptions,
    "dpo": DPOOptions, "run": RunOptions,
}
# Options that describe one invocation, not the run: never inherited from a saved config.
PER_INVOCATION = {"resume", "stop_at_iter"}
# Options you may change on --resume without breaking bitwise reproducibility.
RESUME_SAFE = {"resume", "stop_at_iter", "log_interval", "save_interval", "keep_last",
               "num_workers", "num_threads", "tensorboard", "out_dir", "eval_prompts",
               "max_new_tokens", "peak_flops", "eval_interval", "eval_iters", "dist_timeout",
               "verbose"}


@dataclass
class Config:
    """All option groups; `cfg.optimization.lr`, or flat: `cfg.lr`."""

    data: DataOptions = field(default_factory=DataOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    optimization: OptimizationOptions = field(default_factory=OptimizationOptions)
    system: SystemOptions = field(default_factory=SystemOptions)
    parallel: ParallelOptions = field(default_factory=ParallelOptions)
    eval: EvalOptions = field(default_factory=EvalOptions)
    dpo: DPOOptions = field(default_factory=DPOOptions)
    run: RunOptions = field(default_factory=RunOptions)

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails
        group = _OPTION_GROUP.get(name)
        if group is None:
            raise AttributeError(f"no option {name!r}")
        return getattr(getattr(self, group), name)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _OPTION_GROUP}

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> Config:
        cfg = cls()
        for name, value in values.items():
            setattr(getattr(cfg, _lookup(name, source)), name, _check_type(name, value, source))
        return cfg

    def diff_from_defaults(self) -> dict[str, Any]:
        defaults = Config().to_dict()
        return {k: v for k, v in self.to_dict().items() if v != defaults[k]}

    def check(self) -> None:
        """Every option in range and every combination workable, before any data or model is
        built; all problems are reported together, in one line."""
        problems = [range_problem(f"--{name}", getattr(self, name), low=low)
                    for name, low in _LOWER_BOUNDS.items()]
        lr_problem = range_problem("--lr", self.lr, 0, low_open=True)
        # Bounds that are other options apply once those are valid (one message per mistake).
        problems += [
            lr_problem,
            range_problem("--min_lr", self.min_lr, 0, None if lr_problem else self.lr),
            range_problem("--adam_beta1", self.adam_beta1, 0, 1, high_open=True),
            range_problem("--adam_beta2", self.adam_beta2, 0, 1, high_open=True),
            range_problem("--adam_eps", self.adam_eps, 0, low_open=True),
            range_problem("--dropout", self.dropout, 0, 1, high_open=True),
            range_problem("--dpo_beta", self.dpo_beta, 0, low_open=True),
            range_problem("--dpo_label_smoothing", self.dpo_label_smoothing, 0, 0.5,
                          high_open=True),
            range_problem("--peak_flops", self.peak_flops, 0, low_open=True),
            range_problem("--initial_loss_scale", self.initial_loss_scale, 0, low_open=True),
            range_problem("--min_loss_scale", self.min_loss_scale, 0, self.initial_loss_scale,
                          low_open=True),
            range_problem("--warmup_iters", self.warmup_iters, 0),  # > max_iters: never decays
            range_problem("--stop_at_iter", self.stop_at_iter, 1),
            range_problem("--dist_timeout", self.dist_timeout, 0, low_open=True),
        ]
        if self.stop_at_iter is not None and self.stop_at_iter > self.max_iters:
            problems.append(f"--stop_at_iter={self.stop_at_iter} is beyond "
                            f"--max_iters={self.max_iters}")
        if self.task_type == "dpo" and not self.init_from:
            problems.append("--task_type=dpo needs --init_from=<the SFT model>: it is both the "
                            "starting policy and the frozen reference")
        if self.comm_hook == "overlap_optim" and self.grad_clip > 0:
            problems.append("--comm_hook=overlap_optim updates each bucket before the others "
                            "are reduced, so it cannot clip by the global norm: add --grad_clip=0")
        if self.data_format != "stream" and (self.data_mix or self.skip_bad_records):
            problems.append("--data_mix and --skip_bad_records apply to raw shards: add "
                            "--data_format=stream")
        if self.pack_samples and (self.task_type != "sft" or self.data_format == "stream"):
            problems.append("--pack_samples packs SFT samples from --data_format=pretok: use "
                            "it with --task_type=sft only")
        if self.device not in ("auto", "cpu", "cuda"):
            problems.append(f"--device must be auto, cpu or cuda, got {self.device!r}")
        elif self.device == "cuda" and not torch.cuda.is_available():
            problems.append("--device=cuda but CUDA is not available here: use --device=cpu "
                            "(or auto)")
        if self.init_from is None and not any(problems):  # a fresh model: its shape, as
            try:                                               # the model will check it
                preset_model_config(self, vocab_size=1)  # the tokenizer is not loaded yet
            except ValueError as error:
                problems.append(f"model: {error}")
        raise_problems(problems)


# Lower bounds of the options that only have one (unset optional options are not checked).
_LOWER_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("batch_size", "gradient_accumulation_steps", "max_seq_len", "max_iters",
                     "log_interval", "eval_interval", "save_interval", "eval_iters",
                     "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "intermediate_size", "num_threads", "bucket_size",
                     "loss_scale_window", "hysteresis", "powersgd_rank", "max_new_tokens"), 1),
    **dict.fromkeys(("num_workers", "keep_last", "weight_decay", "grad_clip", "dpo_nll_weight",
                     "powersgd_warmup_iters", "seed", "shuffle_buffer"), 0),
}


_OPTION_GROUP: dict[str, str] = {f.name: group for group, cls in GROUPS.items()
                                 for f in fields(cls)}
_TYPES: dict[str, Any] = {name: hint for cls in GROUPS.values()
                          for name, hint in typing.get_type_hints(cls).items()}


def _lookup(name: str, source: str) -> str:
    """The group of option `name`, or an error suggesting the closest names."""
    if name in _OPTION_GROUP:
        return _OPTION_GROUP[name]
    close = difflib.get_close_matches(name, _OPTION_GROUP, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join('--' + c for c in close)}?" if close else ""
    raise ValueError(f"{source}: unknown option {name!r}{hint} (--help lists all options)")


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " | ".join(map(str, typing.get_args(hint)))
    return str(hint).replace("typing.", "") if not isinstance(hint, type) else hint.__name__


def _split_optional(hint: Any) -> tuple[Any, bool]:
    """`int | None` -> (int, True); `int` -> (int, False)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


def _matches(base: Any, value: Any) -> bool:
    origin = typing.get_origin(base)
    if origin is Literal:
        return value in typing.get_args(base)
    if origin is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if base is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int subclass; True is not a learning rate
        return False
    return isinstance(value, (int, float)) if base is float else isinstance(value, base)


def _check_type(name: str, value: Any, source: str) -> Any:
    """`value` (from JSON / a .py file) checked against the option's type (int -> float ok)."""
    base, optional = _split_optional(_TYPES[name])
    if value is None and optional:
        return None
    if not _matches(base, value):
        raise ValueError(
            f"{source}: option {name!r} expects {_type_name(_TYPES[name])}, got {value!r}")
    return float(value) if base is float else value


def _parse_value(name: str, text: str) -> Any:
    """A command-line string -> the option's type (`--x=none` clears an optional)."""
    hint = _TYPES[name]
    base, optional = _split_optional(hint)
    if optional and text.lower() in ("none", "null", ""):
        return None
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if base is int:
            return int(float(text)) if "e" in text.lower() and float(text).is_integer() \
                else int(text)
        if base is float:
            return float(text)
        if typing.get_origin(base) is list:
            value = json.loads(text) if text.startswith("[") else [text]
            return _check_type(name, value, "--" + name)
        if typing.get_origin(base) is Literal:
            return _check_type(name, text, "--" + name)
        return text
    except ValueError as error:
        if str(error).startswith("--"):
            raise
        raise ValueError(f"--{name}: expects {_type_name(hint)}, got {text!r}") from None


# ----------------------------------------------------------------------------- files

RESOLVED_KEY = "resolved"  # config.json: what `auto` options resolved to (not an option)

def load_config_file(path: str | Path) -> dict[str, Any]:
    """Options from a `config.json` or an `exp_config.py` (only `name = <literal>` lines)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object of options")
        values.pop(RESOLVED_KEY, None)
    elif path.suffix == ".py":
        values = {}
        for node in ast.parse(text, filename=str(path)).body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                raise ValueError(f"{path}:{node.lineno}: only `name = value` lines are allowed")
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"{path}:{node.lineno}: the value must be a literal") from None
    else:
        raise ValueError(f"{path}: a config file must be .py or .json")
    for name in values:
        _lookup(name, str(path))
    return values


def save_config(cfg: Config, run_dir: str | Path, resolved: dict[str, Any] | None = None
                ) -> None:
    """Write `config.json` and `exp_config.py` (both atomic) into the run dir; `resolved`
    (what `auto` options became on this run, e.g. the measured precision) is recorded too."""
    run_dir = Path(run_dir)
    atomic_write_json(run_dir / "config.json",
                      {**cfg.to_dict(), **({RESOLVED_KEY: resolved} if resolved else {})})
    lines = ['"""Resolved config of this run: python train_my_ddp.py exp_config.py [--k=v ...]"""']
    if resolved:
        lines.append(f"# {RESOLVED_KEY} on this run: {json.dumps(resolved)}")
    for group, cls in GROUPS.items():
        lines.append(f"\n# --- {group}")
        lines += [f"{f.name} = {getattr(cfg, f.name)!r}" for f in fields(cls)]
    atomic_write_text(run_dir / "exp_config.py", "\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- command line

def parse_command_line(argv: list[str]) -> tuple[str | None, dict[str, Any]]:
    """`[config_file] --k=v --flag ...` -> (config file or None, {option: parsed value})."""
    config_file, overrides = None, {}
    for arg in argv:
        if not arg.startswith("--"):
            if config_file is not None:
                raise ValueError(f"only one config file may be given ({config_file!r}, {arg!r})")
            config_file = arg
            continue
        name, has_value, text = arg[2:].partition("=")
        _lookup(name, "command line")
        if not has_value:
            if _TYPES[name] is not bool:
                raise ValueError(f"--{name} needs a value: --{name}=<{_type_name(_TYPES[name])}>")
            text = "true"
        overrides[name] = _parse_value(name, text)
    return config_file, overrides


def resolve_config(argv: list[str]) -> tuple[Config, list[str]]:
    """The run's config from the command line (see the module docstring for precedence).

    Returns the config and a list of human-readable notes (resume changes) for the log.
    """
    config_file, overrides = parse_command_line(argv)
    explicit = load_config_file(config_file) if config_file else {}
    explicit.update(overrides)
    merged = Config.from_dict(explicit, "command line").to_dict()
    notes: list[str] = []
    saved_path = Path(merged["out_dir"]) / "config.json"
    if merged["resume"] and saved_path.exists():
        saved = {k: v for k, v in load_config_file(saved_path).items()
                 if k not in PER_INVOCATION}
        merged = {**Config.from_dict(saved, str(saved_path)).to_dict(), **explicit}
        for name, value in explicit.items():
            if name in saved and saved[name] != value:
                breaks = "" if name in RESUME_SAFE else " (breaks bitwise reproducibility)"
                notes.append(f"resume: {name} changed {saved[name]!r} -> {value!r}{breaks}")
                if breaks:
                    warnings.warn(notes[-1], stacklevel=2)
    cfg = Config.from_dict(merged)
    cfg.check()
    return cfg, notes


def format_help() -> str:
    lines = ["usage: [torchrun ...] train_my_ddp.py [config.py|config.json] [--option=value ...]",
             "booleans: --flag or --flag=true|false; optionals: --x=none",
             "precedence: defaults < config file < command line (on --resume: the run's "
             "saved config.json < explicit options)"]
    for group, cls in GROUPS.items():
        lines.append(f"\n{group}:")
        for f in fields(cls):
            default = f.default if f.default is not MISSING else f.default_factory()
            lines.append(f"  --{f.name:<28s} {_type_name(_TYPES[f.name])} = {default!r}")
            lines.append(f"      {f.metadata['help']}")
    return "\n".join(lines)


def config_from_argv(argv: list[str] | None = None) -> tuple[Config, list[str]]:
    """Entry-point helper: prints help and exits on --help; a bad option raises ValueError
    (the entry point's `utils.cli_errors.run_main` prints it in one line, exit code 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(format_help())
        raise SystemExit(0)
    return resolve_config(argv)
