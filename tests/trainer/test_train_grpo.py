"""GRPO through `train_my_ddp.py --task_type=grpo`: a tiny policy learns from a user's reward
function; one global batch is one objective on every layout (2 ranks, ZeRO-3, accumulation,
LoRA); a stopped and resumed run equals the uninterrupted one bitwise (also mid-round, with
--grpo_iterations 2); bad options and reward functions are refused in one line.

The policy is a tiny model pretrained for a few steps; the prompts are plain strings with a
`letter` column, and the reward (a user's module, written to a file here) is the share of the
answer's characters that are that letter: random at first, so every group has a spread, and
learnable by a 20k-parameter model within a few dozen steps."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load

import train_my_ddp
from tests.train_helpers import (
    TINY_ARGS,
    data_args,
    records,
    run_main,
    run_on_two_ranks,
)
from utils.cli_errors import run_main as cli_main

REWARD_MODULE = '''
def letter_share(prompts, completions, letter, **columns):
    return [text.count(want) / max(len(text), 1) for text, want in zip(completions, letter)]


def not_scored(prompts, completions, **columns):
    return [None] * len(completions)
'''
PROMPTS = ["Once upon a time", "The king said", "In the morning", "She wrote", "We went",
           "A letter came", "Under the tree", "He asked why"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory, data):
    """A tiny pretrained model (a few steps) to start GRPO from."""
    run_dir = tmp_path_factory.mktemp("grpo") / "pretrained"
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}",
                     "--max_iters=4", "--eval_interval=100", "--eval_at_start=false"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def grpo_inputs(tmp_path_factory, data, policy):
    """(prompt records dir, the reward module's path, the base argv of a GRPO run)."""
    root = tmp_path_factory.mktemp("grpo_inputs")
    prompts = root / "prompts"
    prompts.mkdir()
    with open(prompts / "train.jsonl", "w", encoding="utf-8") as handle:
        for index in range(64):
            handle.write(json.dumps({"prompt": PROMPTS[index % len(PROMPTS)],
                                     "letter": "e"}) + "\n")
    rewards = root / "my_rewards.py"
    rewards.write_text(REWARD_MODULE, encoding="utf-8")
    argv = [*TINY_ARGS, "--task_type=grpo", f"--data_dir={prompts}",
            f"--tokenizer_dir={data['tokenizer']}", f"--init_from={policy}",
            f"--reward_fn={rewards}:letter_share", "--num_generations=4",
            "--max_completion_length=6", "--batch_size=4", "--eval_interval=100",
            "--eval_at_start=false", "--warmup_iters=0", "--lr=1e-2", "--min_lr=1e-2",
            "--grpo_beta=0.04"]
    return prompts, rewards, argv


def rewards_by_step(run_dir) -> dict[int, float]:
    return {r["step"]: r["reward"] for r in records(run_dir, "train")}


def test_a_tiny_policy_learns_a_users_reward(tmp_path, grpo_inputs):
    _, _, argv = grpo_inputs
    run_dir = tmp_path / "learn"
    assert run_main([*argv, f"--out_dir={run_dir}", "--max_iters=40",
                     "--gradient_accumulation_steps=2"]) == 0
    rewards = list(rewards_by_step(run_dir).values())
    assert len(rewards) == 40
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.1, rewards
    train = records(run_dir, "train")[-1]
    for key in ("kl", "clip_ratio/low", "completion_length", "frac_reward_zero_std",
                "rewards/letter_share/mean", "rewards/letter_share/std", "reward_std"):
        assert key in train, key
    evaluation = records(run_dir, "eval")[-1]
    assert evaluation["val_reward"] == pytest.approx(-evaluation["val_loss"])
    samples = records(run_dir, "samples")[-1]["samples"]
    assert samples and all(isinstance(sample["reward"], float) for sample in samples)
    assert {sample["prompt"] for sample in samples} <= set(PROMPTS)


def grpo_run(argv, run_dir, *extra):
    return [*argv, f"--out_dir={run_dir}", "--max_iters=3", "--log_interval=1", *extra]


def assert_same_run(run_dir, reference_dir, step, weights):
    ours, theirs = records(run_dir, "train"), records(reference_dir, "train")
    assert [r["step"] for r in ours] == [r["step"] for r in theirs]
    for mine, reference in zip(ours, theirs):
        for key in ("loss", "grad_norm", "reward", "kl", "completion_length",
                    "clip_ratio/low", "clip_ratio/high"):
            assert mine[key] == pytest.approx(reference[key], rel=1e-4, abs=1e-6), key
    ours_weights = load_weights(run_dir, step, weights)
    for name, tensor in load_weights(reference_dir, step, weights).items():
        # Adam divides by sqrt(v): a rounding-level gradient difference moves a weight whose
        # gradient is near 0 by up to ~lr x 1e-3
        torch.testing.assert_close(ours_weights[name], tensor, rtol=1e-3, atol=1e-4)


def load_weights(run_dir, step, weights):
    return load((run_dir / "ckpt" / f"step_{step:06d}" / weights).read_bytes())


# (ranks, layout, options of both runs): each equals one process with the whole global batch
# (batch 8). The 2-rank layouts run in the slow lane (a spawn of 2 gloo ranks, each loss type
# in it).
LAYOUTS = [
    pytest.param(1, ["--batch_size=4", "--gradient_accumulation_steps=2"], [],
                 id="accumulation"),
    pytest.param(1, ["--batch_size=4", "--gradient_accumulation_steps=2"],
                 ["--grpo_iterations=2"], id="accumulation, each round used twice"),
    pytest.param(2, ["--batch_size=4", "--zero_stage=1", "--overlap_param_gather"], [],
                 id="2 ranks ZeRO-1 overlapped gather", marks=pytest.mark.slow),
    pytest.param(2, ["--batch_size=4", "--zero_stage=2"], ["--lora_rank=4", "--lora_alpha=8"],
                 id="2 ranks ZeRO-2 LoRA", marks=pytest.mark.slow),
    pytest.param(2, ["--batch_size=2", "--gradient_accumulation_steps=2", "--zero_stage=3"], [],
                 id="2 ranks ZeRO-3 x accumulation", marks=pytest.mark.slow),
]
LOSS_TYPES = {"grpo": ["--grpo_loss_type=grpo"],
              "bnpo": ["--grpo_loss_type=bnpo"],
              "dr_grpo": ["--grpo_loss_type=dr_grpo", "--scale_rewards=batch"]}


@pytest.mark.parametrize(("ranks", "layout", "both"), LAYOUTS)
def test_one_global_batch_is_one_objective_on_every_layout(tmp_path, grpo_inputs, ranks,
                                                           layout, both):
    """Every loss type (dr_grpo with the batch's std: its all-reduce) on the layout equals one
    process: losses, grad norms, rewards, KL and the final weights (LoRA: its adapters)."""
    _, _, argv = grpo_inputs
    runs = {loss: grpo_run(argv, tmp_path / loss, *layout, *both, *options)
            for loss, options in LOSS_TYPES.items()}
    assert ([run_main(run) for run in runs.values()] if ranks == 1
            else run_on_two_ranks(*runs.values())) == [0] * len(runs)
    weights = "lora_adapters.safetensors" if "--lora_rank=4" in both else "model.safetensors"
    for loss, options in LOSS_TYPES.items():
        reference = tmp_path / f"{loss}_one_process"
        assert run_main(grpo_run(argv, reference, "--batch_size=8", *both, *options)) == 0
        assert_same_run(tmp_path / loss, reference, 3, weights)


@pytest.mark.parametrize("extra", [
    pytest.param(["--grpo_iterations=2"], id="mid-round, 2 iterations"),
    pytest.param(["--lora_rank=4", "--lora_alpha=8", "--scale_rewards=none"], id="LoRA"),
])
def test_stop_and_resume_equal_the_uninterrupted_run_bitwise(tmp_path, grpo_inputs, extra):
    """Stopped at step 3 (inside the second round of 2 iterations: the checkpoint holds it)
    and resumed to step 4: the same answers, losses and bytes of weights."""
    _, _, argv = grpo_inputs
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run = [*argv, "--max_iters=4", "--batch_size=4", "--save_interval=100", *extra]
    assert run_main([*run, f"--out_dir={whole}"]) == 0
    assert run_main([*run, f"--out_dir={resumed}", "--stop_at_iter=3"]) == 0
    assert run_main([*run, f"--out_dir={resumed}", "--resume"]) == 0
    assert rewards_by_step(resumed) == rewards_by_step(whole)
    assert ({r["step"]: r["loss"] for r in records(resumed, "train")}
            == {r["step"]: r["loss"] for r in records(whole, "train")})
    weights = "lora_adapters.safetensors" if "--lora_rank=4" in extra else "model.safetensors"
    assert ((resumed / "ckpt" / "step_000004" / weights).read_bytes()
            == (whole / "ckpt" / "step_000004" / weights).read_bytes())


@pytest.mark.parametrize(("extra", "message"), [
    (["--num_generations=3"], "not a multiple of --num_generations=3"),
    (["--reward_fn="], "needs --reward_fn"),
    (["--reward_fn=no_such_module_here:f"], "no module 'no_such_module_here'"),
    (["--reward_fn=REWARDS:missing"], "has no function 'missing'"),
    (["--reward_fn=REWARDS:letter_share", "--reward_weights=1,2"], "one finite weight per"),
    (["--reward_fn=PROMPTS/evil.py:letter_share"], "code is never run from a data"),
    (["--tensor_parallel=2"], "runs on data parallelism"),
    (["--temperature=0"], "--temperature"),
    (["--max_completion_length=40"], "--max_completion_length"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, capsys, grpo_inputs, extra, message):
    prompts, rewards, argv = grpo_inputs
    (prompts / "evil.py").write_text("def letter_share(**k): return []\n", encoding="utf-8")
    extra = [arg.replace("REWARDS", str(rewards)).replace("PROMPTS", str(prompts))
             for arg in extra]
    code = cli_main(train_my_ddp.main, [*argv, f"--out_dir={tmp_path / 'run'}", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_a_reward_that_scores_nothing_teaches_nothing(tmp_path, grpo_inputs):
    """Every answer unscored (None): advantages 0, so the loss is the KL term alone (0 at
    the first step, where the policy is the reference) and the reward is not a number."""
    _, rewards, argv = grpo_inputs
    run_dir = tmp_path / "unscored"
    assert run_main([*argv, f"--out_dir={run_dir}", "--max_iters=1",
                     f"--reward_fn={rewards}:not_scored"]) == 0
    (train,) = records(run_dir, "train")
    assert train["loss"] == 0.0 and train["grad_norm"] == 0.0
    assert train["reward"] != train["reward"]  # NaN
