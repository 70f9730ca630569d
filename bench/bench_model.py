"""Training-step throughput of our model vs transformers' LlamaForCausalLM, same weights.

    python -m bench.bench_model [--quick | --smoke] [--threads 1] [--profile]

One step = forward + loss + backward + AdamW step, at the same config, batch and precision
(fp32, and bf16 autocast with fp32 parameters). The two implementations run alternately in
the same process (the machine is shared, so timings drift; alternating exposes both to the
same drift) and the table reports medians, both of wall-clock time (tokens/s) and of the
process's CPU time (the steadier ratio when other jobs compete for the cores). "CPU MFU" is
our FLOP/s per CPU-second (6N + 12·L·H·Q·T per token, PaLM appendix B) over the best FLOP/s
per CPU-second of a 1024^3 matmul in the same dtype: with one thread, CPU time is the time
the work really ran, so waiting for a shared core does not count against either.
A second table adds torch.compile (each decoder block compiled, ours via `compile_blocks`,
HF's layers the same way) in fp32: ours+compile against HF eager and HF+compile, four
implementations alternating in one process. Without --quick, a last table compares the peak
memory of one training step (fresh process per measurement; RSS-based, so approximate to ~10%).
"""

from __future__ import annotations

import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from bench import figures
from bench.size_flags import bench_parser
from model.configuration_z2all import Z2allConfig
from model.convert_to_hf import export_hf
from model.modeling_z2all import Z2allForCausalLM
from utils.boolean_flags import add_boolean_flag
from utils.precision import measure_cpu_dtype, time_matmul

# name -> (config overrides on the tiny preset, batch size, sequence length)
_SIZE_25M = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=7, num_attention_heads=8,
                 num_key_value_heads=4)
BENCH_MODELS = {
    "tiny 1x64": (dict(), 1, 64),  # latency-bound: per-op overhead dominates
    "tiny 8x256": (dict(), 8, 256),
    "25M 2x256": (_SIZE_25M, 2, 256),
    # memory only: a 32k vocabulary makes the logits the largest activation
    "25M/32k-vocab 2x512": ({**_SIZE_25M, "vocab_size": 32000}, 2, 512),
}
THROUGHPUT_MODELS = ["tiny 1x64", "tiny 8x256", "25M 2x256"]


def matmul_peak_flops(dtype: torch.dtype, size: int = 1024) -> float:
    """Best-of-N FLOP per CPU-second of one square matmul (one thread): the practical ceiling
    here, timed like the trainer's `--dtype auto` decides (utils/precision.py)."""
    return 2 * size**3 / time_matmul(dtype, size)


def make_step(model: torch.nn.Module, is_ours: bool, input_ids: torch.Tensor,
              labels: torch.Tensor, autocast_dtype: torch.dtype | None):
    """A closure running one optimizer step. Our model takes already-shifted labels; HF's
    shifts `labels` itself, so it gets the unshifted ids (same number of loss terms - 1)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        with torch.autocast(input_ids.device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            if is_ours:
                loss = model(input_ids, labels=labels).loss
            else:
                loss = model(input_ids=input_ids, labels=input_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    return step


def build_pair(name: str, models: dict = BENCH_MODELS
               ) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, torch.Tensor]:
    """(our model, HF Llama with the same weights, input_ids, shifted labels), on the CPU.
    Both models are loaded from safetensors files the same way: where the weights land in
    memory changes memory-bound work (decoding) by ~10%, which must not be mistaken for a code
    difference. `models` maps the name to (overrides on preset "tiny", batch size, length)."""
    from transformers import LlamaForCausalLM

    overrides, batch_size, seq_len = models[name]
    torch.manual_seed(0)
    fresh = Z2allForCausalLM(Z2allConfig.from_preset("tiny", max_position_embeddings=seq_len,
                                                     **overrides))
    with tempfile.TemporaryDirectory() as ours_dir, tempfile.TemporaryDirectory() as hf_dir:
        fresh.save_pretrained(ours_dir)
        export_hf(fresh, hf_dir)
        del fresh
        ours = Z2allForCausalLM.from_pretrained(ours_dir)
        hf = LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa")
    input_ids = torch.randint(0, ours.config.vocab_size, (batch_size, seq_len))
    labels = torch.roll(input_ids, -1, dims=1)
    labels[:, -1] = -100
    return ours.train(), hf.train(), input_ids, labels


def first_step_peak_memory(name: str, impl: str) -> int:
    """Bytes of resident memory one fp32 training step adds at its peak (activations, logits,
    grads and the new AdamW state), measured in a fresh process: Linux's peak-RSS counter
    (VmHWM) is reset just before the step by writing 5 to /proc/self/clear_refs."""
    torch.set_num_threads(1)
    ours, hf, input_ids, labels = build_pair(name)
    model = ours if impl == "ours" else hf
    del ours, hf
    step = make_step(model, impl == "ours", input_ids, labels, None)
    status = Path("/proc/self/status")

    def status_bytes(field: str) -> int:
        line = next(ln for ln in status.read_text().splitlines() if ln.startswith(field))
        return int(line.split()[1]) * 1024

    Path("/proc/self/clear_refs").write_text("5")
    baseline = status_bytes("VmRSS:")
    step()
    return status_bytes("VmHWM:") - baseline


def bench_one(name: str, autocast_dtype: torch.dtype | None, steps: int, rounds: int,
              profile: bool) -> dict:
    ours, hf, input_ids, labels = build_pair(name)
    steps_by_impl = {"ours": make_step(ours, True, input_ids, labels, autocast_dtype),
                     "hf": make_step(hf, False, input_ids, labels, autocast_dtype)}
    for step in steps_by_impl.values():
        step()  # warm-up
    wall = {impl: [] for impl in steps_by_impl}
    cpu = {impl: [] for impl in steps_by_impl}
    for _ in range(rounds):
        for impl, step in steps_by_impl.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                step()
            wall[impl].append((time.perf_counter() - start_wall) / steps)
            cpu[impl].append((time.process_time() - start_cpu) / steps)
    if profile:
        for impl, step in steps_by_impl.items():
            with torch.profiler.profile() as prof:
                step()
            print(f"--- profile: {name} {impl} ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    tokens, seq_len = input_ids.numel(), input_ids.shape[1]
    ours_tps = tokens / statistics.median(wall["ours"])
    hf_tps = tokens / statistics.median(wall["hf"])
    cpu_ratio = statistics.median(cpu["hf"]) / statistics.median(cpu["ours"])
    flops_per_cpu_second = (ours.num_flops_per_token(seq_len) * tokens
                            / statistics.median(cpu["ours"]))
    return {"model": name, "tokens": tokens, "ours_tps": ours_tps, "hf_tps": hf_tps,
            "cpu_ratio": cpu_ratio, "flops": flops_per_cpu_second}


def bench_compiled(name: str, steps: int, rounds: int) -> dict[str, float]:
    """fp32 training-step CPU-time medians of ours/HF, eager and compiled per decoder block.
    The first compiled steps (compilation) are warm-up and not timed."""
    ours, hf, input_ids, labels = build_pair(name)
    ours_compiled, hf_compiled, _, _ = build_pair(name)
    ours_compiled.compile_blocks()
    for layer in hf_compiled.model.layers:
        layer.compile()
    steps_by_impl = {
        "ours": make_step(ours, True, input_ids, labels, None),
        "ours+compile": make_step(ours_compiled, True, input_ids, labels, None),
        "hf": make_step(hf, False, input_ids, labels, None),
        "hf+compile": make_step(hf_compiled, False, input_ids, labels, None)}
    for step in steps_by_impl.values():
        step()  # warm-up; compiles forward and backward graphs
        step()
    cpu = {impl: [] for impl in steps_by_impl}
    for _ in range(rounds):
        for impl, step in steps_by_impl.items():
            start = time.process_time()
            for _ in range(steps):
                step()
            cpu[impl].append((time.process_time() - start) / steps)
    return {impl: input_ids.numel() / statistics.median(times) for impl, times in cpu.items()}


def print_compile_table(names: list[str], steps: int, rounds: int) -> None:
    print("\ntorch.compile (per decoder block), fp32 training step, tok/s from CPU-time medians "
          "of alternating rounds")
    print(f"{'model':<11} {'ours':>8} {'ours+c':>8} {'HF':>8} {'HF+c':>8} "
          f"{'ours+c/HF':>10} {'ours+c/HF+c':>12} {'ours+c/ours':>12}")
    for name in names:
        tps = bench_compiled(name, steps, rounds)
        print(f"{name:<11} {tps['ours']:>8.0f} {tps['ours+compile']:>8.0f} {tps['hf']:>8.0f} "
              f"{tps['hf+compile']:>8.0f} {tps['ours+compile'] / tps['hf']:>9.2f}x "
              f"{tps['ours+compile'] / tps['hf+compile']:>11.2f}x "
              f"{tps['ours+compile'] / tps['ours']:>11.2f}x")


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0], quick="tiny model, fewer rounds",
                          smoke="seconds: the smallest model, one round; proves the bench runs")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 gives steadier numbers on a shared machine)")
    add_boolean_flag(parser, "--profile",
                     help="print where the time goes (torch.profiler) for each run")
    args = parser.parse_args()
    figures.start(args)
    torch.set_num_threads(args.threads)
    names = THROUGHPUT_MODELS[:1 if args.smoke else 2 if args.quick else 3]
    steps, rounds = (1, 1) if args.smoke else (1, 3) if args.quick else (1, 4)
    print(f"this CPU, as train_my_ddp.py --dtype=auto decides: {measure_cpu_dtype().reason}")
    rows = []
    for label, autocast_dtype in (("fp32", None), ("bf16 autocast", torch.bfloat16)):
        peak = matmul_peak_flops(autocast_dtype or torch.float32, 256 if args.smoke else 1024)
        for name in names:
            result = bench_one(name, autocast_dtype, steps, rounds, args.profile)
            rows.append({**result, "precision": label, "mfu": result["flops"] / peak,
                         "peak": peak})
    print(f"\ntraining step (fwd+bwd+AdamW), {args.threads} thread(s), median of alternating "
          "rounds; MFU = FLOP per CPU-second / matmul peak in the same dtype")
    print(f"{'model':<11} {'precision':<14} {'ours tok/s':>11} {'HF tok/s':>10} "
          f"{'ours/HF wall':>13} {'ours/HF cpu':>12} {'peak GFLOP/s':>13} {'CPU MFU':>8}")
    for row in rows:
        print(f"{row['model']:<11} {row['precision']:<14} {row['ours_tps']:>11.0f} "
              f"{row['hf_tps']:>10.0f} {row['ours_tps'] / row['hf_tps']:>12.2f}x "
              f"{row['cpu_ratio']:>11.2f}x {row['peak'] / 1e9:>13.1f} {row['mfu']:>8.1%}")
        figures.record(f"{row['model']} {row['precision']} training step", row["ours_tps"],
                       row["hf_tps"], "tokens/s", "HF transformers LlamaForCausalLM")
    if names[1:]:
        print("\ngreedy decoding, KV cache, 32-token prompts, 64 new tokens (CPU-time medians)")
        print(f"{'model':<11} {'batch':>5} {'ours tok/s':>11} {'HF tok/s':>10} {'ours/HF':>8}")
    for name in names[1:]:
        row = bench_decode(name, rounds)
        print(f"{name:<11} {BENCH_MODELS[name][1]:>5} {row['ours_tps']:>11.0f} "
              f"{row['hf_tps']:>10.0f} {row['ours_tps'] / row['hf_tps']:>7.2f}x")
        figures.record(f"{name} greedy decoding", row["ours_tps"], row["hf_tps"], "tokens/s",
                       "HF transformers generate")
    print_compile_table(names[1:], steps, rounds)
    if not (args.quick or args.smoke) and Path("/proc/self/clear_refs").exists():
        print_memory_table(["25M 2x256", "25M/32k-vocab 2x512"])
    figures.finish()


def bench_decode(name: str, rounds: int, prompt_len: int = 32, new_tokens: int = 64) -> dict:
    """Greedy decoding with a KV cache, the batch's first `prompt_len` tokens as prompts:
    CPU-time medians of ours.generate vs HF's generate (asserted to give the same tokens)."""
    ours, hf, input_ids, _ = build_pair(name)
    ours.eval()
    hf.eval()
    prompts = input_ids[:, :prompt_len]

    def run_ours() -> torch.Tensor:
        return ours.generate(prompts, new_tokens)

    @torch.no_grad()
    def run_hf() -> torch.Tensor:
        return hf.generate(prompts, max_new_tokens=new_tokens, do_sample=False)

    assert torch.equal(run_ours(), run_hf()), "greedy tokens differ from HF's"  # + warm-up
    cpu = {"ours": [], "hf": []}
    for _ in range(rounds):
        for impl, run in (("ours", run_ours), ("hf", run_hf)):
            start = time.process_time()
            run()
            cpu[impl].append(time.process_time() - start)
    tokens = prompts.shape[0] * new_tokens
    return {"model": name, "ours_tps": tokens / statistics.median(cpu["ours"]),
            "hf_tps": tokens / statistics.median(cpu["hf"])}


def _in_fresh_process(context, fn, *args):
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def print_memory_table(names: list[str]) -> None:
    spawn = multiprocessing.get_context("spawn")
    print("\npeak memory added by the first fp32 training step (fresh process each)")
    print(f"{'model':<20} {'ours MiB':>9} {'HF MiB':>8} {'HF/ours':>8}")
    for name in names:
        ours, hf = (_in_fresh_process(spawn, first_step_peak_memory, name, impl)
                    for impl in ("ours", "hf"))
        print(f"{name:<20} {ours / 2**20:>9.0f} {hf / 2**20:>8.0f} {hf / ours:>7.2f}x")


if __name__ == "__main__":
    main()
