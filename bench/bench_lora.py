"""LoRA vs full fine-tuning of the same model: what trains, what it costs in memory and time.

    python -m bench.bench_lora [--quick | --smoke] [--rank 8] [--threads 1]

Both run the trainer's path on one rank: our DistributedDataParallel (gloo, world size 1) and
the optimizer `get_optimizer` picks, in fp32 and with bf16 parameters (where the optimizer
keeps fp32 main copies). Per variant: trainable parameters, DDP's gradient-buffer bytes,
optimizer-state bytes (Adam moments and fp32 copies: `state_bytes()`), and the median time of
a training step (forward + loss + backward + step). The two variants alternate step by step
in one process, so the shared machine's drift hits both alike. Memory columns transfer to
GPUs as they are; CPU step times understate LoRA's gain, which on a GPU is mostly the
optimizer step and the gradient all-reduce that no longer touch the frozen weights.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from bench import figures
from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.lora import LoraConfig, apply_lora
from model.modeling_z2all import Z2allForCausalLM
from optimizer import OptimizerConfig, get_optimizer
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.local_ranks import find_free_port

# name -> (config overrides on the tiny preset, batch size, sequence length)
SIZES = {
    "smoke": (dict(vocab_size=256, hidden_size=64, num_hidden_layers=2), 2, 32),
    "10M": (dict(vocab_size=8192, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                 num_key_value_heads=2), 2, 128),
    "40M": (dict(vocab_size=8192, hidden_size=640, num_hidden_layers=8, num_attention_heads=10,
                 num_key_value_heads=2), 4, 256),
}


def build(size: str, params_dtype: str, lora_rank: int):
    """(our DDP-wrapped model, its optimizer) for one variant; the same seed for both."""
    overrides, _, _ = SIZES[size]
    torch.manual_seed(0)
    model = Z2allForCausalLM(Z2allConfig.from_preset("tiny", **overrides))
    if lora_rank:
        apply_lora(model, LoraConfig(rank=lora_rank))
    model.to({"fp32": torch.float32, "bf16": torch.bfloat16}[params_dtype])
    ddp = DistributedDataParallel(model, DistributedDataParallelConfig())
    return ddp, get_optimizer(OptimizerConfig(lr=1e-4, params_dtype=params_dtype), ddp)


def train_step(ddp, optimizer, input_ids: torch.Tensor) -> float:
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = ddp(input_ids[:, :-1], labels=input_ids[:, 1:]).loss
    loss.backward()
    ddp.finish_grad_sync()
    optimizer.step()
    return time.perf_counter() - start


def compare(size: str, params_dtype: str, lora_rank: int, steps: int) -> list[dict]:
    _, batch_size, seq_len = SIZES[size]
    variants = {"full": build(size, params_dtype, 0),
                f"LoRA r={lora_rank}": build(size, params_dtype, lora_rank)}
    vocab = next(iter(variants.values()))[0].module.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    times = {name: [] for name in variants}
    for _ in range(steps + 1):  # the first step (allocations, Adam state) is not timed
        input_ids = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=generator)
        for name, (ddp, optimizer) in variants.items():
            times[name].append(train_step(ddp, optimizer, input_ids))
    rows = []
    for name, (ddp, optimizer) in variants.items():
        module = ddp.module
        rows.append({
            "model": f"{size} {params_dtype}", "variant": name,
            "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in module.parameters()),
            "grad_bytes": sum(b.grad_data.numel() * b.grad_data.element_size()
                              for b in ddp.param_and_grad_buffers),
            "optim_bytes": optimizer.state_bytes(),
            "step_s": statistics.median(times[name][1:])})
    return rows


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="one model size, fewer steps",
                          smoke="tiny sizes: checks it runs")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    figures.start(args)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}",
                            rank=0, world_size=1)
    sizes, steps = (["smoke"], 2) if args.smoke else (["10M"], 3) if args.quick \
        else (["10M", "40M"], 6)
    rows = [row for size in sizes for dtype in ("fp32", "bf16")
            for row in compare(size, dtype, args.rank, steps)]
    dist.destroy_process_group()
    print(f"LoRA (all 7 projections) vs full fine-tuning, our DDP + optimizer on one rank, "
          f"{args.threads} thread(s), median of {steps} steps")
    print(f"{'model':<10} {'variant':<10} {'trainable':>12} {'of total':>8} {'grads MiB':>10} "
          f"{'optim MiB':>10} {'step ms':>8}")
    for row in rows:
        print(f"{row['model']:<10} {row['variant']:<10} {row['trainable']:>12,} "
              f"{row['trainable'] / row['total']:>8.2%} {row['grad_bytes'] / 2**20:>10.2f} "
              f"{row['optim_bytes'] / 2**20:>10.2f} {row['step_s'] * 1000:>8.1f}")
    full = {row["model"]: row for row in rows if row["variant"] == "full"}
    for row in rows:
        if row["variant"] != "full":
            for key, label, unit in (("step_s", "step time", "s"),
                                     ("optim_bytes", "optimizer state", "bytes"),
                                     ("grad_bytes", "gradient buffer", "bytes")):
                figures.record(f"{row['model']} {row['variant']}: {label}", row[key],
                               full[row["model"]][key], unit, "full fine-tuning",
                               higher_is_better=False)
    figures.finish()


if __name__ == "__main__":
    main()
