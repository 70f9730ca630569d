"""Will it fit? Print the bytes one rank holds for a model at a ZeRO stage, and, given the
device's size, whether that fits and which options would make it fit.

    python -m tools.memory_plan --model_preset 0.5B --world_size 8 --zero_stage 3 --dtype bf16 \\
        --batch_size 4 --max_seq_len 2048 [--activation_checkpointing] [--lora_rank 8]
        [--tensor_parallel T --pipeline_parallel P --context_parallel C --rank R
         --gradient_accumulation_steps M]
    python -m tools.memory_plan --init_from meta-llama/Llama-3.1-8B --device_memory 80GB

The model is a preset, or `--init_from` as the trainer takes it: a z2all run or checkpoint, an
HF Llama directory, or a Hub id, read from the local HF cache (nothing is downloaded; only its
config.json is read, never the weights). With `--device_memory` (80GB: 80 x 2^30 bytes, as
GPU makers count) the plan is compared with it: "fits", "fits, but tight" (under 10% left for
what the plan does not count), or "does not fit", then each option that cuts memory (activation
checkpointing, a smaller micro-batch with more accumulation steps, a higher ZeRO stage, LoRA,
bf16, more ranks) with the total it would give, and where none fits alone, the fewest of them
that fit together (picked greedily: the biggest cut first).

On a tensor/pipeline/context grid (data parallel D = world_size / (T x P x C), ranks laid out
as the trainer lays them out) the ranks hold different parts: `--rank` picks one (default 0,
the first stage; the last stage holds the head). With `--context_parallel C` each rank
computes max_seq_len / C tokens of every sequence (ring attention), so its activations are
~1/C, and ZeRO shards over the D x C ranks that hold the same weights.

Parameters, gradients and optimizer state are computed exactly as the code lays them out
(parallel_plan/memory_plan.py; the trainer prints the same plan at start-up); activations are an
estimate. With --lora_rank only the adapters have gradients and optimizer state; the frozen
base is its own line, whole on every data-parallel rank at every stage. Not counted: the CUDA
context, allocator fragmentation, temporary buffers of one collective (one unit's whole
gradient at stages 2/3, two units' params at stage 3).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from typing import Any

from model.configuration_z2all import PRESETS, Z2allConfig
from model.loading import load_model_config
from model.lora import LoraConfig
from parallel.pipeline_parallel.schedules import SCHEDULES
from parallel_plan.llama_shapes import check_parallel_shapes
from parallel_plan.memory_plan import MemoryPlan, plan_memory
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.hub import local_dir
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser

# What the plan leaves out (the CUDA context, ~0.5 GiB on recent NVIDIA GPUs; the caching
# allocator's fragmentation; one collective's buffers) has to fit in what is left: under this
# share of the device, the verdict is "tight".
TIGHT_SHARE = 0.10
UNIT_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}  # of 1024: a GPU's "80GB" is 80 GiB
LORA_SUGGESTED_RANK = 8
NODE_GPUS = 8


def memory_size(text: str) -> int:
    """"80GB", "80GiB", "80G" -> 80 x 2^30 bytes, as GPU makers count (an A100 80GB holds
    81,920 MiB); a bare number is bytes (argparse type)."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expects a size such as 80GB, got {text!r}")
    return int(float(match.group(1)) * 1024 ** UNIT_POWERS[match.group(2)])


def build_parser() -> OptionParser:
    parser = OptionParser(prog="python -m tools.memory_plan", description=__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", choices=sorted(PRESETS), default=None,
                        help="default: 0.1B, unless --init_from names the model")
    parser.add_argument("--init_from", default=None,
                        help="a z2all run/checkpoint, an HF Llama dir or a Hub id in the local "
                             "HF cache (its config.json only; nothing is downloaded)")
    parser.add_argument("--device_memory", type=memory_size, default=None,
                        help="the device's memory (80GB, 80GiB): says whether the plan fits "
                             "and what to change")
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="override the preset's vocabulary size")
    parser.add_argument("--world_size", type=int, default=1,
                        help="all ranks (data parallel: world_size / (T x P x C))")
    parser.add_argument("--zero_stage", type=int, choices=(0, 1, 2, 3), default=0)
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="bf16")
    parser.add_argument("--batch_size", type=int, default=8, help="micro-batch rows per rank")
    parser.add_argument("--max_seq_len", type=int, default=1024)
    add_boolean_flag(parser, "--activation_checkpointing", help="recompute activations")
    add_boolean_flag(parser, "--grad_reduce_in_fp32", default=True,
                     help="fp32 gradients (false: in the params' dtype)")
    parser.add_argument("--tensor_parallel", type=int, default=1, help="T")
    parser.add_argument("--pipeline_parallel", type=int, default=1, help="P")
    parser.add_argument("--context_parallel", type=int, default=1,
                        help="C: every sequence split over C ranks (ring attention)")
    parser.add_argument("--pp_schedule", choices=SCHEDULES, default="1f1b")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1,
                        help="micro-batches per step (a pipeline stage holds several)")
    parser.add_argument("--rank", type=int, default=0, help="whose bytes (on a grid)")
    parser.add_argument("--lora_rank", type=int, default=0,
                        help="LoRA adapters of this rank on a frozen base (0 = full training)")
    parser.add_argument("--lora_targets", default=LoraConfig.targets,
                        help="comma list of HF Llama projections that get adapters")
    return parser


def model_config(args: argparse.Namespace) -> tuple[Z2allConfig, str]:
    """(the model's config, its name for the heading): a preset, or --init_from's config."""
    if args.init_from and args.model_preset:
        raise ValueError("give --model_preset or --init_from, not both")
    overrides = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    if not args.init_from:
        preset = args.model_preset or "0.1B"
        return Z2allConfig.from_preset(preset, **overrides), preset
    config = load_model_config(local_dir(args.init_from, "--init_from", cache_only=True))
    return dataclasses.replace(config, **overrides), args.init_from


def plan_for(args: argparse.Namespace, config: Z2allConfig) -> MemoryPlan:
    """The plan of one rank under the options in `args` (shapes checked first)."""
    check_parallel_shapes(config, args.world_size, args.tensor_parallel, args.pipeline_parallel,
                          seq_len=args.max_seq_len, context_parallel=args.context_parallel)
    lora = (LoraConfig(rank=args.lora_rank, targets=args.lora_targets) if args.lora_rank
            else None)
    return plan_memory(config, args.world_size, args.zero_stage, args.dtype, args.batch_size,
                       args.max_seq_len, args.activation_checkpointing,
                       grad_reduce_in_fp32=args.grad_reduce_in_fp32, rank=args.rank,
                       tensor_parallel=args.tensor_parallel,
                       pipeline_parallel=args.pipeline_parallel, pp_schedule=args.pp_schedule,
                       micro_batches=args.gradient_accumulation_steps, lora=lora,
                       context_parallel=args.context_parallel)


def memory_cuts(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """Each option change that cuts this plan's memory (as the command line would say it, and
    as changed fields): the ones the trainer's out-of-memory advice names, plus more ranks."""
    cuts = []
    if not args.activation_checkpointing:
        cuts.append(("--activation_checkpointing", {"activation_checkpointing": True}))
    batch, steps = args.batch_size, args.gradient_accumulation_steps
    while batch > 1:  # the same global batch in smaller micro-batches
        batch, steps = batch // 2, steps * 2
        cuts.append((f"--batch_size {batch} --gradient_accumulation_steps {steps}",
                     {"batch_size": batch, "gradient_accumulation_steps": steps}))
    if args.zero_stage < 3 and args.world_size > 1:
        cuts.append(("--zero_stage 3", {"zero_stage": 3}))
    elif args.zero_stage < 3:  # one device: ZeRO-3 over one node's GPUs (8 on DGX/HGX boards)
        cuts.append((f"--zero_stage 3 --world_size {NODE_GPUS}",
                     {"zero_stage": 3, "world_size": NODE_GPUS}))
    if args.lora_rank == 0:
        cuts.append((f"--lora_rank {LORA_SUGGESTED_RANK}", {"lora_rank": LORA_SUGGESTED_RANK}))
    if args.dtype == "fp32":
        cuts.append(("--dtype bf16", {"dtype": "bf16"}))
    return cuts


def verdict(args: argparse.Namespace, config: Z2allConfig, total: int) -> list[str]:
    """Whether `total` fits `--device_memory`, and, unless it fits with room, each memory cut
    with the total it would give (one line each; those that do not apply are left out)."""
    device, gib = args.device_memory, 2**30
    left = device - total
    size = f"{total / gib:.2f} GiB planned of {device / gib:.2f} GiB device memory"
    if left >= TIGHT_SHARE * device:
        return [f"fits: {size} ({left / gib:.2f} GiB left for what the plan does not count)"]
    lines = [(f"fits, but tight: {size} (the CUDA context and fragmentation may not fit in "
              f"the {left / gib:.2f} GiB left)" if left >= 0 else f"does not fit: {size}")
             + "; options that cut memory:"]
    totals = []
    for flags, changes in memory_cuts(args):
        try:
            totals.append((plan_for(_changed(args, changes), config).total, flags, changes))
        except ValueError:  # the shapes do not divide on that layout
            continue
    lines += [f"  {flags:<56} -> {cut / gib:8.2f} GiB  {_fits(cut, device)}"
              for cut, flags, _ in totals]
    together, combined = cuts_together(args, config, total, [(f, c) for _, f, c in totals])
    if len(together) > 1:
        lines.append(f"  together: {' '.join(together)} -> {combined / gib:.2f} GiB  "
                     f"{_fits(combined, device)}")
    return lines


def cuts_together(args: argparse.Namespace, config: Z2allConfig, total: int,
                  cuts: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], int]:
    """(the flags of the cuts picked, the total with all of them): greedily, the cut that
    lowers the combined total most, until it fits or nothing lowers it (the micro-batch
    sizes are alternatives: one at most)."""
    picked, changes, combined = [], {}, total
    while _fits(combined, args.device_memory) != "fits":
        tries = []
        for flags, more in cuts:
            if changes.keys() & more.keys():
                continue
            try:
                tries.append((plan_for(_changed(args, {**changes, **more}), config).total,
                              flags, more))
            except ValueError:  # the shapes do not divide on that layout
                continue
        if not tries or min(t[0] for t in tries) >= combined:
            break
        combined, flags, more = min(tries, key=lambda t: t[0])
        picked.append(flags)
        changes.update(more)
    return picked, combined


def _changed(args: argparse.Namespace, changes: dict[str, Any]) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})


def _fits(total: int, device: int) -> str:
    return "fits" if total <= device * (1 - TIGHT_SHARE) else "still too big"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    raise_problems([range_problem(f"--{name}", getattr(args, name), low=1) for name in (
        "world_size", "batch_size", "max_seq_len", "tensor_parallel", "pipeline_parallel",
        "context_parallel", "gradient_accumulation_steps")]
                   + [range_problem("--rank", args.rank, 0, args.world_size - 1)])
    config, model_name = model_config(args)
    plan = plan_for(args, config)
    model_parallel = args.tensor_parallel * args.pipeline_parallel * args.context_parallel
    grid = (f" (T {args.tensor_parallel} x P {args.pipeline_parallel} x C "
            f"{args.context_parallel}: rank {args.rank})" if model_parallel > 1 else "")
    print(f"model {model_name}, ZeRO stage {args.zero_stage}, {args.world_size} "
          f"rank(s){grid}, {args.dtype}, micro-batch {args.batch_size} x {args.max_seq_len}, "
          f"activation checkpointing {'on' if args.activation_checkpointing else 'off'}"
          f"{f', LoRA rank {args.lora_rank}' if args.lora_rank else ''}; per rank:")
    print(plan.render())
    if args.device_memory is not None:
        print("\n".join(verdict(args, config, plan.total)))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
