"""`make gpu-check`: the real CUDA paths against their CPU references. Skipped without a GPU in
`make test`; `make gpu-check` first runs tools/gpu_check.py, which fails without one.

What these prove on a GPU node (what the CPU suite can only emulate, tests/fake_gpu_libs):
- the fast kernels are chosen (flash-attn, apex fused RMSNorm, apex FusedAdam): a node with a
  broken install fails here instead of silently running the torch fallbacks;
- the model in bf16 on the GPU (forward, backward, torch.compile, KV-cache decoding with flash)
  matches fp32 on the CPU within a tolerance *measured* per run: the same bf16 model's error on
  the CPU's torch path, times SPREAD_FACTOR (the two paths round differently, not worse);
- NCCL at world size 2 when the node has >= 2 GPUs (else 1): DDP against gloo, PowerSGD on
  its side stream, ZeRO-1 with CPU offload, OverlappedAdamW with its side stream (the overlap
  it achieved is measured with CUDA events and printed);
- the optimizers on the GPU match the CPU ones, and a GPU checkpoint resumes on the CPU;
- the grid paths as users run them: train_my_ddp.py under torchrun, one NCCL rank per GPU,
  TP2 (with sequence parallelism), PP2 and CP2 (ring attention's send/recv on NCCL; pretrain
  and padded SFT) at world size 2, and issue #30's done-when command
  (an HF Llama-3 base, DP2 x TP2, ZeRO-3, LoRA rank 8) at world size 4, each against the same
  command on one GPU (the same micro-batches): every step's loss and gradient norm, and the
  saved weights (the adapters, for LoRA). An entry that needs more GPUs than the node has is
  skipped, saying how many.
The other distributed tests run the NCCL group beside the gloo default group: one set of
processes runs both sides.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from model import kernels
from model.lora_checkpoint import ADAPTERS_FILE
from optimizer import OptimizerConfig, get_optimizer
from optimizer.adamw import adamw_implementation
from optimizer.optimizer import FP32Optimizer
from optimizer.overlapped_adamw import OverlappedAdamW
from parallel.distributed_data_parallel import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
)
from parallel.distributed_data_parallel.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from parallel.local_ranks import run_on_ranks
from tests.model.model_helpers import VOCAB, random_batch, small_model
from tests.optimizer.helpers import OneProcessDDP, TinyNet, loss_fn, random_batches
from tests.parallel.grid_helpers import ADAM_EPS
from tests.parallel.toy_models import make_batch, make_mlp, mse_loss
from tests.train_helpers import TINY_ARGS, data_args, records, tiny_training_data
from tests.trainer.test_train_stream import finish, torchrun
from tools import tiny_hf_model

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPUS = torch.cuda.device_count()
WORLD_SIZE = 2 if GPUS >= 2 else 1
SPREAD_FACTOR = 3.0   # GPU bf16 error may exceed the CPU bf16 error by this factor, no more
ERROR_FLOOR = 1e-3    # a spread measured as ~0 (exact in both) must not demand bit equality


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.detach().float().cpu(), expected.detach().float().cpu()
    return float((got - expected).abs().max() / expected.abs().max().clamp(min=1e-12))


def _assert_within_spread(got: dict, bf16_on_cpu: dict, fp32: dict) -> None:
    """Each tensor's GPU error vs fp32 is at most SPREAD_FACTOR x the CPU bf16 one."""
    for name, expected in fp32.items():
        spread = _relative_error(bf16_on_cpu[name], expected)
        error = _relative_error(got[name], expected)
        assert error <= SPREAD_FACTOR * spread + ERROR_FLOOR, (name, error, spread)


def test_the_fast_kernels_are_chosen():
    """flash-attn >= 2.1 on sm80+, apex with its extensions: else the kernel line says why."""
    device = torch.device("cuda")
    choices = kernels.kernel_choices(device, torch.bfloat16, 64)
    assert choices["attention"] == "flash-attn (varlen for padded batches)", choices
    assert choices["rms_norm"] == "apex-fused", choices
    assert choices["rotary"].startswith("flash-attn") and choices["swiglu"] == "flash-attn"
    assert adamw_implementation(device) == "apex-fused"


# ---- the model: bf16 on the GPU vs fp32 on the CPU ---------------------------------------------

def _reference_model():
    return small_model("gqa", hidden_size=128, num_attention_heads=4)  # head_dim 32


def _loss_and_grads(model, input_ids, labels, mask) -> dict:
    device = next(model.parameters()).device
    model.zero_grad(set_to_none=True)
    loss = model(input_ids.to(device), labels=labels.to(device),
                 attention_mask=mask.to(device)).loss
    loss.backward()
    return {"loss": loss.detach().float().cpu(),
            **{name: p.grad.detach().float().cpu() for name, p in model.named_parameters()}}


def _batch(padded: bool):
    input_ids, labels = random_batch(3, 40)
    mask = torch.ones_like(input_ids)
    if padded:  # right padding, as the SFT/DPO collators make: flash-attn's varlen path
        mask[0, 25:] = 0
        labels = labels.masked_fill(mask == 0, -100)
    return input_ids, labels, mask


@pytest.mark.parametrize("padded", [False, True])
def test_model_bf16_on_cuda_matches_fp32_within_the_measured_spread(padded):
    reference, batch = _reference_model(), _batch(padded)
    fp32 = _loss_and_grads(reference, *batch)
    bf16_on_cpu = _loss_and_grads(copy.deepcopy(reference).bfloat16(), *batch)
    on_gpu = _loss_and_grads(copy.deepcopy(reference).to("cuda", torch.bfloat16), *batch)
    _assert_within_spread(on_gpu, bf16_on_cpu, fp32)


def test_compiled_blocks_match_fp32_within_the_measured_spread():
    reference, batch = _reference_model(), _batch(padded=False)
    fp32 = _loss_and_grads(reference, *batch)
    bf16_on_cpu = _loss_and_grads(copy.deepcopy(reference).bfloat16(), *batch)
    compiled = copy.deepcopy(reference).to("cuda", torch.bfloat16)
    compiled.compile_blocks()
    _assert_within_spread(_loss_and_grads(compiled, *batch), bf16_on_cpu, fp32)


def _decode(model, left_padded: bool) -> torch.Tensor:
    """Prefill a prompt, then 3 tokens one at a time (KV cache): every step's logits."""
    device = next(model.parameters()).device
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    steps = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(prompt)
    if left_padded:
        mask[0, :3] = 0
    cache, key_mask = model.new_kv_cache(2, capacity=10), mask.to(device)
    with torch.no_grad():
        logits = [model.next_token_logits(prompt.to(device), key_mask if left_padded else None,
                                          cache)]
        for step in range(steps.shape[1]):
            key_mask = torch.cat([key_mask, key_mask.new_ones(2, 1)], dim=1)
            logits.append(model.next_token_logits(steps[:, step:step + 1].to(device),
                                                  key_mask if left_padded else None, cache))
    return torch.stack(logits).cpu()


@pytest.mark.parametrize("left_padded", [False, True])
def test_kv_cache_decoding_with_flash_matches_fp32_within_the_measured_spread(left_padded):
    reference = _reference_model().eval()
    fp32 = {"logits": _decode(reference, left_padded)}
    bf16_on_cpu = {"logits": _decode(copy.deepcopy(reference).bfloat16(), left_padded)}
    on_gpu = {"logits": _decode(copy.deepcopy(reference).to("cuda", torch.bfloat16),
                                left_padded)}
    _assert_within_spread(on_gpu, bf16_on_cpu, fp32)


# ---- the optimizers on the GPU ------------------------------------------------------------------

def _train(optimizer, ddp, batches, device):
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss_fn(ddp, (inputs.to(device), targets.to(device))).backward()
        ddp.finish_grad_sync()
        optimizer.step()


def test_optimizer_on_the_gpu_matches_the_cpu_and_its_checkpoint_resumes_there(tmp_path):
    config = OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=1.0)
    batches = random_batches(5, 8, seed=1)
    torch.manual_seed(0)
    on_cpu = OneProcessDDP(TinyNet())
    on_gpu = OneProcessDDP(copy.deepcopy(on_cpu.module).cuda())
    cpu_optimizer, gpu_optimizer = FP32Optimizer(config, on_cpu), FP32Optimizer(config, on_gpu)
    _train(cpu_optimizer, on_cpu, batches, "cpu")
    _train(gpu_optimizer, on_gpu, batches[:3], "cuda")
    gpu_optimizer.save_checkpoint(tmp_path)
    resumed = OneProcessDDP(copy.deepcopy(on_gpu.module).cpu())
    resumed_optimizer = FP32Optimizer(config, resumed)
    resumed_optimizer.load_checkpoint(tmp_path)
    _train(resumed_optimizer, resumed, batches[3:], "cpu")
    _train(gpu_optimizer, on_gpu, batches[3:], "cuda")
    for on_cuda, back_on_cpu, expected in zip(on_gpu.module.parameters(),
                                              resumed.module.parameters(),
                                              on_cpu.module.parameters(), strict=True):
        torch.testing.assert_close(on_cuda.detach().cpu(), expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(back_on_cpu.detach(), expected, rtol=1e-4, atol=1e-5)


# ---- NCCL (world size 2 with >= 2 GPUs) against gloo ------------------------------------------

def _nccl_group_and_device(rank: int) -> tuple[dist.ProcessGroup, torch.device]:
    torch.cuda.set_device(rank)
    return dist.new_group(backend="nccl"), torch.device("cuda", rank)


def _ddp_grads(model, process_group, device, rank, steps=2, bucket_size=60, state=None):
    """main_grad of every parameter after each of `steps` steps; with `state`, PowerSGD."""
    ddp = DistributedDataParallel(copy.deepcopy(model).to(device),
                                  DistributedDataParallelConfig(bucket_size=bucket_size,
                                                                overlap_grad_reduce=True),
                                  process_group=process_group)
    if state is not None:
        ddp.register_comm_hook(state, powerSGD_hook)
    grads = []
    for step in range(steps):
        inputs, targets = make_batch(rank, step, 0)
        mse_loss(ddp, inputs.to(device), targets.to(device)).backward()
        ddp.finish_grad_sync()
        grads.append([p.main_grad.cpu().clone() for p in ddp.module.parameters()])
        ddp.zero_grad_buffer()
    return grads


def _nccl_vs_gloo(rank: int, world_size: int) -> None:
    nccl, device = _nccl_group_and_device(rank)
    model = make_mlp(seed=0)
    for on_gpu, on_cpu in zip(_ddp_grads(model, nccl, device, rank),
                              _ddp_grads(model, None, "cpu", rank)):
        for got, expected in zip(on_gpu, on_cpu):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_nccl_ddp_matches_gloo():
    run_on_ranks(_nccl_vs_gloo, world_size=WORLD_SIZE)


def _powersgd_grads(model, process_group, device, rank, steps=3):
    state = PowerSGDState(process_group, matrix_approximation_rank=2, start_powerSGD_iter=1,
                          min_compression_rate=0.0)
    return _ddp_grads(model, process_group, device, rank, steps, bucket_size=None,
                      state=state), state


def _powersgd_side_stream_vs_cpu(rank: int, world_size: int) -> None:
    nccl, device = _nccl_group_and_device(rank)
    model = make_mlp(seed=0)
    gpu_grads, gpu_state = _powersgd_grads(model, nccl, device, rank)
    cpu_grads, _ = _powersgd_grads(model, None, "cpu", rank)
    assert gpu_state.side_stream.stream is not None  # the compression ran on a side stream
    for on_gpu, on_cpu in zip(gpu_grads, cpu_grads):
        for got, expected in zip(on_gpu, on_cpu):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_powersgd_on_a_side_stream_matches_the_cpu_hook():
    run_on_ranks(_powersgd_side_stream_vs_cpu, world_size=WORLD_SIZE)


def _zero1_params(model, process_group, device, rank, cpu_offload, steps=3):
    ddp = DistributedDataParallel(copy.deepcopy(model).to(device), DistributedDataParallelConfig(
        bucket_size=60, use_distributed_optimizer=True), process_group=process_group)
    optimizer = get_optimizer(OptimizerConfig(lr=1e-2, weight_decay=0.1, clip_grad=1.0,
                                              use_distributed_optimizer=True,
                                              cpu_offload=cpu_offload), ddp)
    for step in range(steps):
        optimizer.zero_grad()
        inputs, targets = make_batch(rank, step, 0)
        mse_loss(ddp, inputs.to(device), targets.to(device)).backward()
        ddp.finish_grad_sync()
        optimizer.step()
    optimizer.finish_param_sync()
    return [p.detach().cpu() for p in ddp.module.parameters()]


def _zero1_offload_vs_cpu(rank: int, world_size: int) -> None:
    nccl, device = _nccl_group_and_device(rank)
    model = make_mlp(seed=0)
    on_gpu = _zero1_params(model, nccl, device, rank, cpu_offload=True)
    on_cpu = _zero1_params(model, None, "cpu", rank, cpu_offload=False)
    for got, expected in zip(on_gpu, on_cpu):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_zero1_with_cpu_offload_on_cuda_matches_cpu():
    run_on_ranks(_zero1_offload_vs_cpu, world_size=WORLD_SIZE)


def _overlapped_adamw_params(model, process_group, device, rank, steps=3):
    """Params after `steps` OverlappedAdamW steps, and (CUDA) how many bucket steps of the
    last one had finished on the GPU before backward's last kernel did (CUDA events)."""
    ddp = DistributedDataParallel(copy.deepcopy(model).to(device), DistributedDataParallelConfig(
        bucket_size=60, overlap_grad_reduce=True), process_group=process_group)
    optimizer = OverlappedAdamW(ddp, lr=1e-2, weight_decay=0.1)
    stepped: list = []
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        step_bucket = optimizer.step_bucket

        def timed_step_bucket(bucket):
            step_bucket(bucket)
            stepped.append(torch.cuda.Event(enable_timing=True))
            stepped[-1].record()  # on the side stream, current while the step is queued
        optimizer.step_bucket = timed_step_bucket
    for step in range(steps):
        stepped.clear()
        inputs, targets = make_batch(rank, step, 0)
        mse_loss(ddp, inputs.to(device), targets.to(device)).backward()
        if on_cuda:
            backward_done = torch.cuda.Event(enable_timing=True)
            backward_done.record()
        ddp.finish_grad_sync()
        optimizer.step()
        optimizer.zero_grad()
    early = 0
    if on_cuda:
        assert (optimizer.side_stream.stream is not None
                and len(stepped) == len(optimizer.buckets))
        torch.cuda.synchronize()
        early = sum(event.elapsed_time(backward_done) > 0 for event in stepped)
    return [p.detach().cpu() for p in ddp.module.parameters()], early, len(optimizer.buckets)


def _overlapped_adamw_vs_cpu(rank: int, world_size: int) -> None:
    nccl, device = _nccl_group_and_device(rank)
    model = make_mlp(seed=0)
    on_gpu, early, buckets = _overlapped_adamw_params(model, nccl, device, rank)
    on_cpu, _, _ = _overlapped_adamw_params(model, None, "cpu", rank)
    for got, expected in zip(on_gpu, on_cpu):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    print(f"gpu-check rank {rank}: OverlappedAdamW, {early}/{buckets} bucket steps finished on "
          f"the GPU before backward's last kernel")


def test_overlapped_adamw_on_its_side_stream_matches_cpu():
    run_on_ranks(_overlapped_adamw_vs_cpu, world_size=WORLD_SIZE)


# ---- the grid paths: train_my_ddp.py under torchrun on NCCL vs the same command on one GPU ----

# Each micro-batch one sequence: an SFT loss is a mean over the micro-batch's tokens, so the
# one-GPU reference reads the same micro-batches (--gradient_accumulation_steps 2 x D).
GRID_ARGS = ["--num_hidden_layers=2", "--num_key_value_heads=2", "--max_iters=3",
             "--eval_interval=3", "--save_interval=100", "--eval_prompts=[]", "--batch_size=1",
             f"--adam_eps={ADAM_EPS}"]  # (rounding noise not blown up to a whole lr)
# name: (grid options, ranks: one GPU each, data-parallel size D, task, base: None = a fresh
# tiny model, "hf_llama3" = tools/tiny_hf_model.py's with LoRA rank 8: issue #30's done-when)
GRID_RUNS = {
    "tp2_sp": (["--tensor_parallel=2", "--sequence_parallel"], 2, 1, "pretrain", None),
    "pp2": (["--pipeline_parallel=2"], 2, 1, "pretrain", None),
    # context parallelism: the ring's K/V blocks on NCCL send/recv, each rank 2 of 4 chunks
    "cp2": (["--context_parallel=2"], 2, 1, "pretrain", None),
    "cp2_sft": (["--context_parallel=2"], 2, 1, "sft", None),
    "dp2_tp2_zero3_lora_hf_llama3": (["--tensor_parallel=2", "--zero_stage=3"], 4, 2, "sft",
                                     "hf_llama3"),
}


def grid_skip_reason(ranks: int, gpus: int) -> str:
    """Why a grid entry of `ranks` NCCL ranks cannot run on a node with `gpus` GPUs."""
    return (f"needs {ranks} GPUs (one NCCL rank each, world size {ranks}); "
            f"this node has {gpus}")


@pytest.fixture(scope="module")
def grid_data(tmp_path_factory, tiny_hf_tokenizer_dir) -> dict[str, Path]:
    """The trainer tests' tiny data set, and the HF Llama-3 base with its own tokenizer."""
    data = tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)
    base = tmp_path_factory.mktemp("hf") / "hf_llama3"
    tiny_hf_model.main(["--tokenizer_dir", str(tiny_hf_tokenizer_dir), "--style", "llama3",
                        "--out", str(base)])
    return {**data, "hf_llama3": base}


def _grid_args(data: dict[str, Path], task: str, base: str | None) -> list[str]:
    """The command of an entry without its grid; an HF base brings its own tokenizer."""
    if base is None:
        return [*TINY_ARGS, *GRID_ARGS, *data_args(data, task)]
    return [*TINY_ARGS, *GRID_ARGS, f"--task_type={task}", f"--data_dir={data[task]}",
            f"--init_from={data[base]}", "--lora_rank=8", "--lora_alpha=16"]


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.skipif(ranks > GPUS,
                                                reason=grid_skip_reason(ranks, GPUS)))
    for name, (_, ranks, _, _, _) in GRID_RUNS.items()])
def test_grid_on_nccl_trains_like_one_gpu(name, grid_data, tmp_path):
    options, ranks, data_parallel, task, base = GRID_RUNS[name]
    args = _grid_args(grid_data, task, base)
    run, single = tmp_path / name, tmp_path / "one_gpu"
    finish(torchrun([*args, *options, "--gradient_accumulation_steps=2"], run, ranks))
    finish(torchrun([*args, f"--gradient_accumulation_steps={2 * data_parallel}"], single, 1))
    for key in ("loss", "grad_norm"):
        assert ([step[key] for step in records(run, "train")] == pytest.approx(
            [step[key] for step in records(single, "train")], rel=1e-4)), (name, key)
    weights = Path("ckpt") / "step_000003" / (ADAPTERS_FILE if base else "model.safetensors")
    expected, saved = load_file(single / weights), load_file(run / weights)
    assert sorted(saved) == sorted(expected)
    for key in expected:
        torch.testing.assert_close(saved[key], expected[key], rtol=1e-3, atol=1e-4,
                                   msg=lambda message, key=key: f"{name}: {key}: {message}")
