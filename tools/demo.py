"""`make demo`: the whole z2all pipeline on the built-in demo corpus, on CPU, in minutes.

Each stage is an ordinary command from the README, run as a subprocess so the demo exercises
exactly what a user types; the demo only strings them together, times them and sums up:

    corpus -> clean it -> tokenizers -> pretokenized tokens + sample index -> pretrain a
    tiny model -> SFT on the demo skills -> task accuracy -> DPO on near-miss pairs -> task
    accuracy -> GRPO on the model's own graded answers -> task accuracy -> plots; then: what
    cleaning dropped, val loss before/after pretraining, accuracies, GRPO's reward, sample
    generations.

Every stage leaves files the next one starts from (data/demo/..., tokenizer/demo_hf,
out/demo_*/ckpt), so one stage can be re-run alone:

    python -m tools.demo --list            # stage names and their commands
    python -m tools.demo --only sft        # just that stage (its inputs must exist)
    python -m tools.demo --from dpo        # that stage and the ones after it
    python -m tools.demo --dtype bf16 --seed 2   # another precision path / seed, every stage

A re-run stage moves the run it replaces aside (out/demo_x.old-<time>; trainer --overwrite).

The clean stage (data_preprocess/clean_pretrain_data.py) reads the scenes as a crawl would
deliver them, data/demo/pretrain_raw/ (data/build_demo_corpus.py mixes in exact and near
copies of scenes, boilerplate pages, and a page leaking one held-out task), and writes what
survives to data/demo/pretrain/, the folder the tokenizers and the pretokenizer read. What
survives is exactly the scenes, in order (tests/tools/test_demo.py checks it), so the demo
trains on the same tokens as before the stage existed and its measured accuracies hold.
Two options differ from the defaults, each for the demo's data:
- `--min_stop_words 1` (Gopher: 2): Henry V, act III scene 4, is in French (Katharine's
  English lesson) and has one English stop word; a real pipeline would route it to a
  French filter instead of dropping it.
- `--decontaminate_min_words 4` (default 8): the held-out prompts have 2-7 words, so none
  would be matched; with a made-up word or two numbers in them, 4 words do not occur in
  English prose by chance.
It takes seconds (7 CPU-s for 5 MB on one core).

Sized for 2 CPU cores: a 1.0M-parameter model (preset "tiny" with a 512-token vocabulary),
400 pretraining + 3000 SFT + 100 DPO + 300 GRPO steps (docs/grpo.md). Precision is
`--dtype=auto`: each run times a matmul in fp32 and bf16 and takes bf16 (fp32 master weights)
only where it is >= 1.3x faster; on an AVX2-only CPU bf16 is emulated and ~30x slower, so fp32
is chosen there. The training stages show a progress bar with the time left
(tools/stage_progress.py).

Pretraining, SFT and GRPO run as 2 ranks of our DDP (torchrun, one thread each; pretraining also
shards the optimizer state, ZeRO-1; global batch 16 = 8 x 2 ranks, so the loss curve equals
one process with batch 16). Measured: 40 pretraining steps, AVX2 emulated
(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, fp32 chosen), 2 cores shared with other
jobs (load average 6-10):

    layout                          wall     CPU      loss at step 40
    2 ranks x 1 thread, ZeRO-1      63 s     41 s     4.6631
    1 process x 2 threads          261 s    105 s     4.6632

so the 2 ranks are not slower (on a busy machine two intra-op threads mostly wait for each
other), and each rank sends 2.1 MB per step (2 bytes per parameter: the reduce-scatter of the
fp32 gradients).

SFT packs its samples (--pack_samples, dataset/sft_packing.py): a demo sample is 43 tokens on
average (99% under 107), and a padded batch of 16 is as wide as its longest, so half of it
was padding. Packed end to end into rows of 128 with a block-diagonal attention mask, a step
computes the same loss and gradients on 1.8x fewer tokens. Measured: 40 SFT steps from the
pretrained model, AVX2 emulated, fp32, CPU seconds per step after start-up (load 5-7):

    batch                                   tokens/step   CPU s/step
    16 padded (before)                         1427          0.22
    16 packed, 1 process x 1 thread             796          0.12
    32 packed, 1 process x 1 thread            1546          0.25
    16 packed, 2 ranks x 8 (the demo)           ~800          0.17 (both ranks together)

Why SFT runs at a peak learning rate of 1e-3 (issue 23: the demo used 3e-3 and reached 33%
on the fp32 path, 52% on the bf16 path). Held-out accuracy, SFT from the demo's pretrained
model, seed 1337, fp32, 1 process x 1 thread with batch 16 packed (the same global batch as
the demo's 2 ranks), AVX2-only EPYC:

    peak lr, schedule            step 1000   2000    3000    6000
    6e-3, 6000-step cosine                           10%
    3e-3, 6000-step cosine          15%      17%     25%     33%   copy 4%, upper 0% (*)
    1e-3, 6000-step cosine          37%      63%     77%
    1e-3, 3000-step cosine (demo)   38%      62%     77%           copy 98%, upper 100%

(*) the demo's own 2-rank run of the time, whose checkpoints these are.

What 3e-3 got stuck on is copying: copy, upper and reverse need the model to read the quoted
word letter by letter ("the letter after the one I just wrote"), and until it can, it writes
plausible made-up words of its own ('Say "zerule" back to me.' -> 'dude', copy 4% after
6000 steps). The ability is learnable at 3e-3 when copying is all there is to learn (copy
prompts alone: 2% at step 400, 76% at step 600), but in the mixture of six skills it arrived
late or not at all, and *when* it arrived moved with every random detail: seeds 1337 / 1 / 2
ended at 33% / 37% / 46%, and the bf16 path, one more perturbation of the same knife-edge, at
52%. At 1e-3 every run measured copies by step 2000 (copy 94-98% on 3 seeds), so the
result no longer depends on luck (docs/demo.md, "Accuracy across seeds and precisions", lists
both paths and 3 seeds), and 3000 steps suffice where 6000 did not. Things that did not help
at 3e-3: more draws of the hard skills in the SFT mixture (21% at step 2000), and copying
games mixed into the pretraining text (5% at step 1000).

DPO runs at 1e-4, a tenth of SFT's rate, with the chosen answers' NLL weighted 2.0: at 5e-4
(NLL weight 1.0) it lowered the accuracy of the SFT model above (77.3% -> 75.3%, copy 98% ->
92%); at 1e-4 it raised it to 80.0%, but lowered seed 1's (80.7% -> 79.7%, reverse 90% ->
84%); at 5e-5 seed 1 stayed at 80.7%. With the NLL weight at 2.0, which keeps the policy
closer to the answers SFT taught while the DPO term pushes the near misses down, DPO raised
all three seeds: 77.3% -> 80.0% (1337), 80.7% -> 81.0% (1), 76.7% -> 77.7% (2).
The whole demo on the bf16 path (`--dtype bf16`, emulated on this CPU): 60.0% after SFT,
61.3% after DPO (copy 62%, upper 72%, reverse 18% after SFT: the copy ability only partly
there at step 3000, where fp32 has 98%).

The 512-token vocabulary splits made-up words into letters and short pieces (1200 SFT steps
from a random init: 18% with it, 9% with 4096) and makes pretraining cheap. A whole run on
an AVX2-only EPYC (fp32 chosen), 2 cores shared with other jobs (load average 7-10): 2278 s
wall, 1260 CPU-s, of them pretraining 356 CPU-s, SFT 600, the rest 49, and DPO 133 (re-run
with the final NLL weight; 51 in a quieter run: the single-process DPO's two threads spin
while they wait). On 2 idle cores that is at most about 11 minutes (the two 2-rank stages
take CPU/2, the others CPU). The summary reports wall time and CPU time per stage (on a busy
machine, CPU time / 2 estimates the wall time of a 2-rank stage on 2 dedicated cores).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from data_preprocess.cleaning.report import CleanReport
from tools.stage_progress import run_with_progress, training_steps
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.log_setup import configure_logging
from utils.option_parser import OptionParser

DEMO = "data/demo"
TOKENIZER = "tokenizer/demo_hf"
OUT = "out"
VOCAB = "512"  # small: made-up words split into letters and short pieces (see above)
SFT_STEPS = 3000
GRPO_STEPS = 300
RUNS = ("pretrain", "sft", "dpo", "grpo")
# Pretraining runs as 2 processes of our DDP with ZeRO-1 (the optimizer state sharded over the
# ranks), as on a multi-GPU node: torchrun starts the ranks, gloo carries the gradients. SFT
# and GRPO run as 2 ranks too (plain DDP): one thread per rank is faster than 2 threads in 1
# process.
RANKS = 2
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}"]
CHAT_PROMPTS = '--eval_prompts=["What is 3 + 4?", "Reverse the word \\"kato\\".", ' \
               '"Repeat the word \\"mira\\"."]'


def stages(dtype: str = "auto", seed: int = 1337) -> list[tuple[str, list[str]]]:
    """The demo's commands in order, as (stage name, python argv).

    `dtype` and `seed` reach every training and evaluation stage, so another precision path or
    seed is one flag (`python -m tools.demo --dtype bf16 --seed 2`); the corpus stays the same.
    """
    # What every training stage shares: the tokenizer, precision (auto: measured on this CPU,
    # see utils/precision.py), the seed, logging, the sample prompts. Threads: the trainer's
    # default, this machine's cores shared by the ranks. --overwrite: a second `make demo`
    # moves the earlier demo run aside (out/demo_x.old-<time>) instead of being refused.
    train_common = [f"--tokenizer_dir={TOKENIZER}", f"--dtype={dtype}", f"--seed={seed}",
                    "--overwrite", "--log_interval=10", "--keep_last=1", "--max_new_tokens=16"]
    return [
        ("corpus", ["-m", "data.build_demo_corpus", "--out", DEMO]),
        ("clean", ["-m", "data_preprocess.clean_pretrain_data", "--data_dir",
                   f"{DEMO}/pretrain_raw", "--out_dir", f"{DEMO}/pretrain",
                   "--decontaminate", f"{DEMO}/eval",
                   "--min_stop_words", "1", "--decontaminate_min_words", "4"]),  # see above
        ("tokenizer_bpe", ["-m", "tokenizer.train_tokenizer", "--type", "hf", "--input",
                           f"{DEMO}/pretrain", "--vocab_size", VOCAB, "--out", TOKENIZER]),
        ("tokenizer_sp", ["-m", "tokenizer.train_tokenizer", "--type", "sp", "--input",
                          f"{DEMO}/pretrain", "--vocab_size", VOCAB, "--out",
                          "tokenizer/demo_sp"]),
        ("encodings", ["-m", "tokenizer.show_encodings", TOKENIZER, "tokenizer/demo_sp"]),
        ("pretokenize", ["-m", "data_preprocess.pretokenize_pretrain_data", "--data_dir",
                         f"{DEMO}/pretrain", "--tokenizer_dir", TOKENIZER, "--out_dir",
                         f"{DEMO}/pretrain_pretok"]),
        ("sample_index", ["-m", "data_preprocess.build_pretrain_sample_index_map", "--data_dir",
                          f"{DEMO}/pretrain_pretok", "--max_seq_len", "256"]),
        ("pretrain", [*TORCHRUN, "train_my_ddp.py", *train_common, "--task_type=pretrain",
                      "--use_distributed_optimizer",
                      f"--data_dir={DEMO}/pretrain_pretok", f"--out_dir={OUT}/demo_pretrain",
                      "--model_preset=tiny", "--max_seq_len=256",
                      f"--batch_size={16 // RANKS}",  # x 2 ranks = 16 sequences a step
                      "--max_iters=400", "--warmup_iters=20", "--lr=3e-3", "--min_lr=3e-4",
                      "--eval_interval=100", "--eval_iters=4", "--save_interval=100",
                      '--eval_prompts=["ROMEO.", "The king"]']),
        ("sft", [*TORCHRUN, "train_my_ddp.py", *train_common, "--task_type=sft",
                 f"--init_from={OUT}/demo_pretrain", f"--data_dir={DEMO}/sft",
                 f"--out_dir={OUT}/demo_sft", "--max_seq_len=128", "--pack_samples",
                 f"--batch_size={16 // RANKS}",  # x 2 ranks = 16 samples a step, packed
                 f"--max_iters={SFT_STEPS}", "--warmup_iters=30",
                 "--lr=1e-3", "--min_lr=1e-4",  # not 3e-3: see the docstring
                 "--weight_decay=0.0", "--eval_interval=500", "--eval_iters=4",
                 "--save_interval=500", CHAT_PROMPTS]),
        ("accuracy_sft", ["-m", "tools.demo_eval", "--ckpt", f"{OUT}/demo_sft",
                          "--tokenizer_dir", TOKENIZER, "--tasks", f"{DEMO}/eval/tasks.jsonl",
                          f"--dtype={dtype}"]),
        ("dpo", ["train_my_ddp.py", *train_common, "--task_type=dpo",
                 f"--init_from={OUT}/demo_sft", f"--data_dir={DEMO}/dpo",
                 f"--out_dir={OUT}/demo_dpo", "--max_seq_len=128", "--batch_size=16",
                 "--max_iters=100", "--warmup_iters=5", "--lr=1e-4", "--min_lr=1e-5",
                 "--weight_decay=0.0", "--dpo_beta=0.1",
                 "--dpo_nll_weight=2.0", "--eval_interval=50", "--eval_iters=2",
                 "--save_interval=50", CHAT_PROMPTS]),
        ("accuracy_dpo", ["-m", "tools.demo_eval", "--ckpt", f"{OUT}/demo_dpo",
                          "--tokenizer_dir", TOKENIZER, "--tasks", f"{DEMO}/eval/tasks.jsonl",
                          f"--dtype={dtype}"]),
        # GRPO from the DPO model on the four skills it is least sure of (docs/grpo.md): 8
        # answers per prompt sampled by the policy itself, rewarded 1 when the grader says right
        ("grpo", [*TORCHRUN, "train_my_ddp.py", *train_common, "--task_type=grpo",
                  f"--init_from={OUT}/demo_dpo", f"--data_dir={DEMO}/grpo",
                  f"--out_dir={OUT}/demo_grpo", "--max_seq_len=128",
                  f"--batch_size={32 // RANKS}",  # x 2 ranks = 32 answers: 4 prompts x 8
                  "--num_generations=8", "--max_completion_length=12",
                  "--reward_fn=trainer.reward_functions:demo_task_correct",
                  f"--max_iters={GRPO_STEPS}", "--warmup_iters=5", "--lr=1e-4", "--min_lr=1e-5",
                  "--weight_decay=0.0", "--grpo_beta=0.04", "--eval_interval=100",
                  "--eval_iters=8", "--save_interval=100"]),
        ("accuracy_grpo", ["-m", "tools.demo_eval", "--ckpt", f"{OUT}/demo_grpo",
                           "--tokenizer_dir", TOKENIZER, "--tasks", f"{DEMO}/eval/tasks.jsonl",
                           f"--dtype={dtype}"]),
        *[(f"plots_{run}", ["-m", "tools.resplot", f"{OUT}/demo_{run}"])
          for run in RUNS],
    ]


STAGE_NAMES = [name for name, _ in stages()]


def run_stage(name: str, argv: list[str]) -> tuple[float, float]:
    """Run one stage; return (wall seconds, CPU seconds of the stage's processes)."""
    print(f"\n=== {name}: python {' '.join(argv)}", flush=True)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    steps = training_steps(argv)
    if steps:  # a training stage: a progress bar with the time left
        run_with_progress(argv, steps, name)
    else:
        subprocess.run([sys.executable, *argv], check=True)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return time.perf_counter() - start, cpu


def _records(run: str, kind: str) -> list[dict]:
    path = Path(OUT) / f"demo_{run}" / "metrics.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r.get("kind") == kind]


def ddp_traffic_lines() -> list[str]:
    """What our DDP + ZeRO-1 sent during pretraining, with a one-line explanation."""
    runs, steps = _records("pretrain", "run"), _records("pretrain", "train")
    if not runs or not steps or runs[-1]["world_size"] < 2:
        return []
    world_size, num_params = runs[-1]["world_size"], runs[-1]["num_params"]
    sent = steps[-1]["comm_bytes_per_step"]
    return [f"our DDP + ZeRO-1 on {world_size} ranks: each rank sent {sent / 1e6:.2f} MB per "
            f"step to reduce gradients ({sent / num_params:.2f} bytes per parameter)",
            f"  (a reduce-scatter sends ({world_size}-1)/{world_size} of the gradient buffer "
            f"and leaves each rank the average of its 1/{world_size} shard, the only part its "
            "optimizer updates; the updated weights are then all-gathered)"]


def cleaning_lines() -> list[str]:
    """The clean stage's one-line summary, rebuilt from the report it left beside the corpus."""
    path = Path(DEMO) / "pretrain" / "clean_report.json"
    if not path.exists():
        return []
    report = json.loads(path.read_text(encoding="utf-8"))
    counts = CleanReport(report["documents_in"], report["documents_out"], report["bytes_in"],
                         report["bytes_out"], Counter(report["dropped"]))
    return [f"corpus {counts.summary_line()}"]


def summary() -> list[str]:
    """The demo's results, read back from the corpus and the run directories."""
    lines = cleaning_lines()
    config = Path(OUT) / "demo_pretrain" / "config.json"
    if config.exists():
        precision = json.loads(config.read_text(encoding="utf-8")).get("resolved", {})
        lines.append(f"precision: {precision.get('precision', {}).get('reason', '?')}")
    lines += ddp_traffic_lines()
    evals = _records("pretrain", "eval")
    if evals:
        lines.append(f"pretraining val loss: {evals[0]['val_loss']:.3f} (step {evals[0]['step']})"
                     f" -> {evals[-1]['val_loss']:.3f} (step {evals[-1]['step']}); "
                     f"bits/byte {evals[0]['val_bpb']:.2f} -> {evals[-1]['val_bpb']:.2f}")
    for run in ("sft", "dpo", "grpo"):
        path = Path(OUT) / f"demo_{run}" / "task_accuracy.json"
        if path.exists():
            result = json.loads(path.read_text(encoding="utf-8"))
            per_task = ", ".join(f"{t} {a:.0%}" for t, a in result["per_task"].items())
            lines.append(f"task accuracy after {run.upper()}: {result['accuracy']:.1%} "
                         f"({per_task})")
    dpo_train = _records("dpo", "train")
    if dpo_train:
        last = dpo_train[-1]
        lines.append(f"DPO at step {last['step']}: DPO loss {last['dpo_loss']:.3f} (starts at "
                     f"log 2 = 0.693), chosen NLL {last['chosen_nll']:.3f}, "
                     f"reward margin {last['rewards/margins']:.3f}, "
                     f"reward accuracy {last['rewards/accuracies']:.0%}")
    lines += grpo_lines(_records("grpo", "train"), _records("grpo", "eval"))
    for run in RUNS:
        samples = _records(run, "samples")
        for sample in samples[-1]["samples"] if samples else []:
            lines.append(f"[{run}] {sample['prompt']!r} -> {sample['completion']!r}")
    lines += [f"plot: {p}" for p in sorted(Path(OUT).glob("demo_*/plots/*.png"))]
    return lines


def grpo_lines(train: list[dict], evals: list[dict]) -> list[str]:
    """How GRPO's reward moved: the share of sampled answers graded correct (each step's
    prompts differ, so averaged over the first and the last 5 logged steps), and of greedy
    answers to the held-out prompts (first and last evaluation)."""
    if not train or not evals:
        return []
    def mean(records: list[dict], key: str) -> float:
        return sum(record[key] for record in records) / len(records)
    first, last = train[:5], train[-5:]
    return [f"GRPO: sampled answers right {mean(first, 'reward'):.0%} (steps "
            f"{first[0]['step']}-{first[-1]['step']}) -> {mean(last, 'reward'):.0%} (steps "
            f"{last[0]['step']}-{last[-1]['step']}); held-out greedy answers right "
            f"{evals[0]['val_reward']:.0%} -> {evals[-1]['val_reward']:.0%}; groups all right "
            f"or all wrong {mean(last, 'frac_reward_zero_std'):.0%}; KL to the DPO model "
            f"{mean(last, 'kl'):.4f}"]


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description="Run the z2all demo pipeline.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--only", choices=STAGE_NAMES, help="run one stage")
    group.add_argument("--from", dest="start", choices=STAGE_NAMES,
                       help="run from this stage on")
    add_boolean_flag(group, "--list", help="print the stages and exit")
    parser.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto",
                        help="precision of every training and evaluation stage (auto: measured "
                             "on this CPU; bf16 on a CPU without avx512_bf16/AMX is ~4x slower)")
    parser.add_argument("--seed", type=int, default=1337,
                        help="seed of every training stage (the corpus stays the same)")
    args = parser.parse_args(argv)
    configure_logging()
    demo_stages = stages(args.dtype, args.seed)
    if args.list:
        for name, stage_argv in demo_stages:
            print(f"{name:<14s} python {' '.join(stage_argv)}")
        return
    first = STAGE_NAMES.index(args.only or args.start) if (args.only or args.start) else 0
    last = first + 1 if args.only else len(demo_stages)

    timings = [(name, *run_stage(name, stage_argv))
               for name, stage_argv in demo_stages[first:last]]
    print("\n=== demo results")
    for line in summary():
        print(f"  {line}")
    print("\n=== wall time per stage (CPU time: all processes of the stage)")
    for name, wall, cpu in timings:
        print(f"  {name:<16s} {wall:8.1f} s wall {cpu:8.1f} s CPU")
    print(f"  {'total':<16s} {sum(t[1] for t in timings):8.1f} s wall "
          f"{sum(t[2] for t in timings):8.1f} s CPU")
    print(f"\nchat with the model: python serve.py --ckpt {OUT}/demo_dpo  (then open http://127.0.0.1:8000/)")

if __name__ == "__main__":
    sys.exit(run_main(main))
