"""Will it fit? Print the bytes one rank holds for a model preset at a ZeRO stage.

    python -m tools.memory_plan --model_preset 0.5B --world_size 8 --zero_stage 3 --dtype bf16 \\
        --batch_size 4 --max_seq_len 2048 [--activation_checkpointing] [--lora_rank 8]
        [--tensor_parallel T --pipeline_parallel P --context_parallel C --rank R
         --gradient_accumulation_steps M]

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
import sys

from model.configuration_z2all import PRESETS, Z2allConfig
from model.lora import LoraConfig
from parallel.pipeline_parallel.schedules import SCHEDULES
from parallel_plan.llama_shapes import check_parallel_shapes
from parallel_plan.memory_plan import plan_memory
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser


def main(argv: list[str] | None = None) -> int:
    parser = OptionParser(prog="python -m tools.memory_plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_preset", choices=sorted(PRESETS), default="0.1B")
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
    args = parser.parse_args(argv)
    raise_problems([range_problem(f"--{name}", getattr(args, name), low=1) for name in (
        "world_size", "batch_size", "max_seq_len", "tensor_parallel", "pipeline_parallel",
        "context_parallel", "gradient_accumulation_steps")]
                   + [range_problem("--rank", args.rank, 0, args.world_size - 1)])
    overrides = {} if args.vocab_size is None else {"vocab_size": args.vocab_size}
    config = Z2allConfig.from_preset(args.model_preset, **overrides)
    check_parallel_shapes(config, args.world_size, args.tensor_parallel, args.pipeline_parallel,
                          seq_len=args.max_seq_len, context_parallel=args.context_parallel)
    lora = (LoraConfig(rank=args.lora_rank, targets=args.lora_targets) if args.lora_rank
            else None)
    plan = plan_memory(config, args.world_size, args.zero_stage, args.dtype, args.batch_size,
                       args.max_seq_len, args.activation_checkpointing,
                       grad_reduce_in_fp32=args.grad_reduce_in_fp32, rank=args.rank,
                       tensor_parallel=args.tensor_parallel,
                       pipeline_parallel=args.pipeline_parallel, pp_schedule=args.pp_schedule,
                       micro_batches=args.gradient_accumulation_steps, lora=lora,
                       context_parallel=args.context_parallel)
    model_parallel = args.tensor_parallel * args.pipeline_parallel * args.context_parallel
    grid = (f" (T {args.tensor_parallel} x P {args.pipeline_parallel} x C "
            f"{args.context_parallel}: rank {args.rank})" if model_parallel > 1 else "")
    print(f"model {args.model_preset}, ZeRO stage {args.zero_stage}, {args.world_size} "
          f"rank(s){grid}, {args.dtype}, micro-batch {args.batch_size} x {args.max_seq_len}, "
          f"activation checkpointing {'on' if args.activation_checkpointing else 'off'}"
          f"{f', LoRA rank {args.lora_rank}' if lora else ''}; per rank:")
    print(plan.render())
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
