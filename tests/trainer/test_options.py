"""Options: parsing by type, unknown keys, precedence, resume merge, exp_config.py round trip,
--help, and the typed groups (no flat access)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import train_my_ddp
from tests.train_helpers import TINY_ARGS, data_args
from trainer.command_line import format_help, parse_command_line
from trainer.config_files import (
    load_config_file,
    options_from_argv,
    resolve_options,
    save_config,
)
from trainer.options import TrainingOptions
from trainer.parallelize import effective_zero_stage
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main

REPO = Path(__file__).resolve().parents[2]


def test_values_are_parsed_by_the_field_type(tmp_path):
    lr = random.uniform(1e-5, 1e-2)
    # --data_dir: not the default data/demo/pretrain_pretok, which `make demo` fills with
    # pretraining data that an sft run refuses
    cfg, _ = resolve_options([f"--lr={lr!r}", "--batch_size=12", "--use_distributed_optimizer",
                             "--overlap_grad_reduce=false", "--stop_at_iter=7",
                             "--bucket_size=2e6", "--task_type=sft",
                             f"--data_dir={tmp_path / 'sft'}",
                             '--eval_prompts=["x y", "z"]', "--init_from=none"])
    optimization, parallel = cfg.optimization, cfg.parallel
    assert optimization.lr == lr and isinstance(optimization.batch_size, int)
    assert optimization.batch_size == 12 and optimization.stop_at_iter == 7
    assert parallel.use_distributed_optimizer is True and parallel.overlap_grad_reduce is False
    assert parallel.bucket_size == 2_000_000
    assert cfg.data.task_type == "sft" and cfg.eval.eval_prompts == ["x y", "z"]
    assert cfg.model.init_from is None
    with pytest.raises(AttributeError):  # typed groups only: a typo cannot pass silently
        _ = cfg.lr


@pytest.mark.parametrize("arg, message", [
    ("--min_lrr=1", "did you mean --min_lr"),
    ("--batchsize=3", "did you mean --batch_size"),
    ("--batch_size=three", "--batch_size: expects int"),
    ("--resume=maybe", "--resume: expects bool"),
    ("--task_type=rlhf", "expects pretrain | sft | dpo"),
    ("--lr", r"^--lr needs a value: --lr <float> or --lr=<float>$"),
    ("--learning_rate=1e-3", r"did you mean --lr\? \(z2all's name for HF's --learning_rate\)"),
    ("--num_train_epochs=3", "did you mean --max_iters.*not epochs"),
    ("--per_device_train_batch_size=4", "did you mean --batch_size"),
    ("--output_dir=o", "did you mean --out_dir"),
    ("--no_lr", "unknown option 'no_lr'"),
    ("--task_type=dpo", "needs --init_from"),
    ("--comm_hook=overlap_optim", "add --grad_clip=0"),
    ("--stop_at_iter=5000", "beyond --max_iters"),
    ("--batch_size=0", "--batch_size must be >= 1"),
    ("--dist_timeout=0", r"--dist_timeout must be in \(0, 10080\]"),
    ("--max_iters=-1", r"^--max_iters must be >= 1, got -1$"),
    ("--max_iters=0", "--max_iters must be >= 1"),
    ("--stop_at_iter=0", "--stop_at_iter must be >= 1"),
    ("--lr=nan", r"^--lr must be a finite number > 0, got nan$"),
    ("--lr=inf", "--lr must be a finite number > 0"),
    ("--min_lr=0.1", r"--min_lr must be in \[0, 0.0006\]"),
    ("--hidden_size=0", "--hidden_size must be >= 1"),
    ("--hidden_size=30", "model: hidden_size 30 is not divisible by num_attention_heads"),
    ("--grad_clip=nan", "--grad_clip must be a finite number >= 0"),
    ("--grad_clip=-1", "--grad_clip must be >= 0"),
    ("--dpo_beta=0", "--dpo_beta must be > 0"),
    ("--dpo_label_smoothing=0.5", r"--dpo_label_smoothing must be in \[0, 0.5\)"),
    ("--peak_flops=-1", "--peak_flops must be > 0"),
    ("--warmup_iters=-1", "--warmup_iters must be >= 0"),
    ("--num_workers=-1", "--num_workers must be >= 0"),
    ("--adam_beta2=1", r"--adam_beta2 must be in \[0, 1\)"),
    ("--device=tpu", "--device must be auto, cpu or cuda"),
    ("--pack_samples", "--pack_samples packs SFT samples"),
])
def test_bad_arguments_name_the_key(arg, message):
    with pytest.raises(ValueError, match=message):
        resolve_options([arg])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_refused_up_front():
    with pytest.raises(ValueError, match="--device=cuda but CUDA is not available"):
        resolve_options(["--device=cuda"])


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError, match="--batch_size must be >= 1.*--lr must be a finite"):
        resolve_options(["--batch_size=0", "--lr=nan"])


def test_file_then_command_line_precedence(tmp_path):
    lr, warmup = random.uniform(1e-4, 1e-3), random.randint(2, 50)
    (tmp_path / "exp.py").write_text(f'"""doc"""\nlr = {lr!r}\nwarmup_iters = {warmup}\n'
                                     "max_iters = 77\n")
    cfg, _ = resolve_options([str(tmp_path / "exp.py"), "--max_iters=99"])
    optimization = cfg.optimization
    assert (optimization.lr, optimization.warmup_iters, optimization.max_iters) == (lr, warmup, 99)
    (tmp_path / "c.json").write_text(json.dumps({"min_lr": 1e-6, "seed": 5}))
    cfg, _ = resolve_options([str(tmp_path / "c.json"), "--seed=6"])
    assert (cfg.optimization.min_lr, cfg.optimization.seed) == (1e-6, 6)


def test_bad_config_files_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("lr = 1e-3\nimport os\n")
    with pytest.raises(ValueError, match="bad.py:2"):
        load_config_file(bad)
    bad.write_text("lr = 1e-3\nbatch_size = 'big'\n")
    with pytest.raises(ValueError, match="'batch_size' expects int"):
        resolve_options([str(bad)])
    bad.write_text("lrr = 1.0\n")
    with pytest.raises(ValueError, match="did you mean --lr"):
        load_config_file(bad)


def test_exp_config_round_trip(tmp_path):
    cfg, _ = resolve_options(["--lr=0.00123", "--comm_hook=powersgd", "--dropout=0.1",
                             '--eval_prompts=["a \\"quoted\\" prompt"]', "--resume=false"])
    save_config(cfg, tmp_path)
    again, _ = resolve_options([str(tmp_path / "exp_config.py")])
    from_json = TrainingOptions.from_dict(json.loads((tmp_path / "config.json").read_text()))
    assert again.to_dict() == cfg.to_dict() == from_json.to_dict()


def test_resolved_entry_is_recorded_but_not_read_back_as_an_option(tmp_path):
    cfg, _ = resolve_options(["--dtype=auto"])
    save_config(cfg, tmp_path, resolved={"precision": {"dtype": "bf16"}})
    assert json.loads((tmp_path / "config.json").read_text())["resolved"] == {
        "precision": {"dtype": "bf16"}}
    assert '"dtype": "bf16"' in (tmp_path / "exp_config.py").read_text()  # as a comment
    for name in ("config.json", "exp_config.py"):
        again, _ = resolve_options([str(tmp_path / name)])
        assert again.to_dict() == cfg.to_dict() and again.system.dtype == "auto"  # afresh


def test_resume_uses_saved_config_plus_explicit_overrides(tmp_path):
    run = tmp_path / "run"
    original, _ = resolve_options([f"--out_dir={run}", "--lr=0.002", "--max_iters=40",
                                  "--warmup_iters=4", "--stop_at_iter=20"])
    save_config(original, run)
    with pytest.warns(UserWarning, match="max_iters changed 40 -> 50.*reproducibility"):
        resumed, notes = resolve_options([f"--out_dir={run}", "--resume", "--max_iters=50",
                                         "--stop_at_iter=30"])
    resumed_optimization = resumed.optimization
    assert resumed_optimization.lr == 0.002 and resumed_optimization.max_iters == 50
    assert resumed_optimization.stop_at_iter == 30
    assert not any("max_iters" in n for n in notes)  # warned once, not noted again
    again, _ = resolve_options([f"--out_dir={run}", "--resume"])
    assert again.optimization.stop_at_iter is None  # per-invocation: not inherited
    assert again.optimization.max_iters == 40


def test_resume_inherits_the_grid_whole_or_takes_it_whole(tmp_path):
    """The world size comes from the launcher, so a grid mixed of saved and new parts (the
    saved --tensor_parallel=2 under a new --pipeline_parallel=2) would change the data-parallel
    size silently: giving any part of the grid gives all of it."""
    run = tmp_path / "run"
    original, _ = resolve_options([f"--out_dir={run}", "--tensor_parallel=2",
                                  "--sequence_parallel"])
    save_config(original, run)
    kept, _ = resolve_options([f"--out_dir={run}", "--resume"])
    assert (kept.parallel.tensor_parallel, kept.parallel.sequence_parallel) == (2, True)
    with pytest.warns(UserWarning) as caught:
        moved, _ = resolve_options([f"--out_dir={run}", "--resume", "--pipeline_parallel=2"])
    assert sorted(str(w.message).split(" (")[0] for w in caught) == [
        "resume: pipeline_parallel changed 1 -> 2", "resume: sequence_parallel changed True -> "
        "False", "resume: tensor_parallel changed 2 -> 1"]
    parallel = moved.parallel
    assert (parallel.tensor_parallel, parallel.pipeline_parallel,
            parallel.sequence_parallel) == (1, 2, False)


def test_help_lists_every_option_grouped():
    text = format_help()
    for name in TrainingOptions().to_dict():
        assert f"--{name} " in text
    assert "\noptimization (" in text and "\nparallel (" in text


def test_use_distributed_optimizer_is_documented_and_read_as_zero_stage_1():
    """Megatron-LM's spelling of ZeRO-1: --help and docs/design.md's table say so, and the run
    takes it as --zero_stage 1."""
    help_line = format_help().split("--use_distributed_optimizer", 1)[1].split("\n--", 1)[0]
    assert "alias of --zero_stage 1" in " ".join(help_line.split())
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert "| `use_distributed_optimizer` | bool | `False` | an alias of --zero_stage 1" in design
    options, _ = resolve_options(["--use_distributed_optimizer"])
    assert effective_zero_stage(options.parallel) == 1


def test_flag_without_value_only_for_booleans():
    assert parse_command_line(["--resume"])[1] == {"resume": True}


@pytest.mark.parametrize("layout", [["--comm_hook=overlap_optim", "--grad_clip=0"],
                                    ["--tensor_parallel=2"]], ids=["overlap_optim", "grid"])
def test_fp16_is_one_rule_checked_before_any_work(data, tmp_path, capsys, layout):
    """Where fp16's loss scale cannot skip whole steps, --dtype=fp16 is refused by the option
    check, in one line (the overlapped step used to refuse it only once data was built)."""
    argv = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={tmp_path / 'run'}",
            "--dtype=fp16", *layout]
    assert cli_run_main(train_my_ddp.main, argv) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing was built
    assert captured.err.count("\n") == 1 and "--dtype=fp16 cannot be combined with" in captured.err


def test_values_may_follow_the_key_after_a_space():
    spaced, _ = resolve_options(["--lr", "0.002", "--zero_stage", "1", "--comm_hook", "bf16",
                                 "--eval_prompts", '["a b"]', "--init_from", "none",
                                 "--max_iters", "1e3"])
    joined, _ = resolve_options(["--lr=0.002", "--zero_stage=1", "--comm_hook=bf16",
                                 '--eval_prompts=["a b"]', "--init_from=none", "--max_iters=1e3"])
    assert spaced.to_dict() == joined.to_dict()
    with pytest.raises(ValueError, match="--batch_size needs a value"):
        parse_command_line(["--batch_size", "--lr=1"])


def test_boolean_flag_forms():
    parsed = parse_command_line(["--resume", "false", "--verbose", "--compile", "TRUE",
                                 "--no_eval_at_start", "--no-overlap_grad_reduce",
                                 "--sequence_parallel=no", "--overwrite", "cfg.yaml"])
    assert parsed == ("cfg.yaml", {"resume": False, "verbose": True, "compile": True,
                                   "eval_at_start": False, "overlap_grad_reduce": False,
                                   "sequence_parallel": False, "overwrite": True})


@pytest.mark.parametrize("args", [["--eval_at_start", "-1"], ["--compile", "maybe"],
                                  ["--resume", "2"]])
def test_a_value_after_a_flag_is_refused_naming_the_flag(capsys, args):
    """Not taken for the config file (before: "-1: a config file must be .py, ...")."""
    assert cli_run_main(train_my_ddp.main, args) == 2
    assert capsys.readouterr().err == (
        f"error: {args[0]}: expects true or false (or the flag alone, or --no_{args[0][2:]}), "
        f"got {args[1]!r}\n")


def test_the_trainer_takes_spaced_values_and_points_at_hf_names(tmp_path):
    """Through the real entry point: `--key value` gets as far as the path checks; an HF name
    ends in one line with z2all's name, exit 2, before any work."""
    def trainer(*args):
        return subprocess.run([sys.executable, "train_my_ddp.py", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    done = trainer("--data_dir", str(tmp_path / "nowhere"), "--max_iters", "5",
                   "--out_dir", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr == f"error: --data_dir={tmp_path / 'nowhere'}: no such file or directory\n"
    done = trainer("--learning_rate", "1e-3")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "did you mean --lr?" in done.stderr and not (tmp_path / "run").exists()


def test_yaml_and_toml_configs_flat_or_nested_with_the_command_line_on_top(tmp_path):
    (tmp_path / "flat.yml").write_text("lr: 3e-4\nzero_stage: 1\ncompile: true\n"
                                       "eval_prompts: [a, b]\ninit_from: null\n")
    (tmp_path / "nested.yaml").write_text("optimization:\n  lr: 3.0e-4\nparallel:\n"
                                          "  zero_stage: 1\nsystem: {compile: true}\n"
                                          "eval_prompts: [a, b]\n")
    (tmp_path / "nested.toml").write_text('eval_prompts = ["a", "b"]\n[optimization]\n'
                                          'lr = 3e-4\n[parallel]\nzero_stage = 1\n'
                                          '[system]\ncompile = true\n')
    (tmp_path / "flat.toml").write_text('lr = 0.0003\nzero_stage = 1\ncompile = true\n'
                                        'eval_prompts = ["a", "b"]\nbucket_size = "none"\n')
    expected, _ = resolve_options(["--lr=3e-4", "--zero_stage=1", "--compile",
                                   '--eval_prompts=["a", "b"]'])
    for name in ("flat.yml", "nested.yaml", "nested.toml"):
        assert resolve_options([str(tmp_path / name)])[0] == expected, name
    from_toml, _ = resolve_options([str(tmp_path / "flat.toml"), "--lr", "1e-3"])
    assert from_toml.optimization.lr == 1e-3 and from_toml.parallel.bucket_size is None


@pytest.mark.parametrize("name, text, message", [
    ("c.yaml", "optimization:\n  learning_rate: 1e-3\n", r"c.yaml: .*did you mean --lr\?"),
    ("c.yaml", "lrr: 1e-3\n", r"c.yaml: unknown option 'lrr'; did you mean --lr"),
    ("c.yaml", "model:\n  lr: 1e-3\n", "c.yaml: option 'lr' belongs under 'optimization'"),
    ("c.yaml", "lr: 1e-3\noptimization: {lr: 2e-3}\n", "c.yaml: option 'lr' is given twice"),
    ("c.yaml", "lr: 1e-3\nbatch_size: [\n", r"c.yaml:3: invalid YAML"),
    ("c.yaml", "- lr\n", "c.yaml: expected a mapping of options"),
    ("c.yaml", "batch_size: big\n", "c.yaml: option 'batch_size' expects int, got 'big'"),
    ("c.toml", "[optimization]\nlrr = 1.0\n", "c.toml: unknown option 'lrr'; did you mean --lr"),
    ("c.toml", "lr = \n", r"c.toml: invalid TOML: .*line 1"),
    ("c.ini", "lr=1\n", r"c.ini: a config file must be .py, .json, .yaml, .yml or .toml"),
])
def test_bad_yaml_and_toml_configs_name_file_and_fix(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        resolve_options([str(tmp_path / name)])


def test_a_yaml_config_cannot_run_code(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "evil.yaml").write_text(
        f"lr: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ValueError, match="evil.yaml:1: invalid YAML"):
        resolve_options([str(tmp_path / "evil.yaml")])
    assert not marker.exists()


@pytest.mark.parametrize("fmt", ["py", "json", "yaml", "toml"])
def test_print_config_reads_back_to_the_same_options(tmp_path, capsys, fmt):
    argv = ["--lr", "0.00123", "--bucket_size", "none", "--adam_eps=1e-8", "--dropout=0.1",
            '--eval_prompts=["a \\"quoted\\" prompt", "é"]', "--init_from", "none"]
    with pytest.raises(SystemExit) as done:
        options_from_argv([*argv, "--print_config", fmt])
    assert done.value.code == 0
    (tmp_path / f"c.{fmt}").write_text(capsys.readouterr().out)
    assert resolve_options([str(tmp_path / f"c.{fmt}")])[0] == resolve_options(argv)[0]


def test_the_trainer_prints_its_config_as_asked(tmp_path):
    (tmp_path / "c.yaml").write_text("optimization:\n  lr: 1e-3\n  max_iters: 50\n")
    done = subprocess.run([sys.executable, "train_my_ddp.py", str(tmp_path / "c.yaml"),
                           "--max_iters", "60", "--print_config", "toml"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = tomllib.loads(done.stdout)
    assert printed["optimization"]["lr"] == 1e-3 and printed["optimization"]["max_iters"] == 60
    assert set(printed) == set(TrainingOptions().__dataclass_fields__)


@pytest.mark.parametrize("name, content, message", [
    ("c.py", b"lr = 1e-3\nbatch_size = (\n", r"c.py:2: invalid Python: '\(' was never closed"),
    ("c.py", b"lr = 1e-3\n  seed = 1\n", "c.py:2: invalid Python: unexpected indent"),
    ("c.yaml", b"1: 2\n", "c.yaml: option names are text, got the key 1"),
    ("c.yaml", b"optimization:\n  true: 2\n", "c.yaml: option names are text, got the key True"),
    ("c.json", b"\xff\xfe{}", r"c.json: not UTF-8 text \(byte 0\): save it as UTF-8"),
])
def test_a_config_file_that_cannot_be_read_is_one_line(tmp_path, capsys, name, content,
                                                       message):
    """Through the trainer's entry point: the file and line, exit 2 (before: a SyntaxError or
    TypeError traceback)."""
    (tmp_path / name).write_bytes(content)
    assert cli_run_main(train_my_ddp.main, [str(tmp_path / name), "--max_iters=1"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"error: {tmp_path / name}"), error
    assert re.search(message, error), error


@pytest.mark.parametrize("name, text", [("c.py", "lr = 0.00123\n"), ("c.json", '{"lr": 0.00123}'),
                                        ("c.yaml", "lr: 0.00123\n"), ("c.toml", "lr = 0.00123\n")])
def test_a_config_file_with_a_byte_order_mark_reads_as_without(tmp_path, capsys, name, text):
    """Some Windows editors start UTF-8 files with a byte-order mark; Python itself accepts
    one in a .py file, so the trainer does too, in every format."""
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    with pytest.raises(SystemExit) as done:
        train_my_ddp.main([str(tmp_path / name), "--print_config", "json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["lr"] == 0.00123
def test_a_resumed_runs_exp_config_starts_a_new_run(data, tmp_path):
    """exp_config.py is "accepted back as the config file": a resumed run's too, so it holds
    the per-invocation options (resume, stop_at_iter, overwrite) at their defaults."""
    run, reuse = tmp_path / "run", tmp_path / "reuse"
    common = [*TINY_ARGS, *data_args(data, "pretrain"), "--max_iters=2", "--eval_at_start=false",
              "--eval_interval=2", "--save_interval=1"]
    assert train_my_ddp.main([*common, f"--out_dir={run}", "--stop_at_iter=1"]) == 0
    assert train_my_ddp.main([*common, f"--out_dir={run}", "--resume"]) == 0
    exp_config = (run / "exp_config.py").read_text()
    for line in ("resume = False", "stop_at_iter = None", "overwrite = False"):
        assert line in exp_config
    assert cli_run_main(train_my_ddp.main, [str(run / "exp_config.py"),
                                            f"--out_dir={reuse}"]) == 0
    assert (reuse / "ckpt").is_dir()


@pytest.mark.parametrize("argv, expected", [
    (["--no-eval-at-start", "--eval-interval", "5"], {"eval_at_start": False, "eval_interval": 5}),
    (["--eval-interval=7", "--no-eval_at_start"], {"eval_at_start": False, "eval_interval": 7}),
    (["--gradient-accumulation-steps", "3", "--activation-checkpointing"],
     {"gradient_accumulation_steps": 3, "activation_checkpointing": True}),
    (["--config", "CONFIG"], {"lr": 0.0042, "eval_interval": 9}),
    (["--config=CONFIG", "--lr", "1e-3"], {"lr": 0.001, "eval_interval": 9}),
], ids=["no-eval-at-start", "mixed", "dashed-int-and-flag", "--config FILE", "--config=FILE"])
def test_dashed_names_and_config_by_name_as_torchrun_and_trl_spell_them(argv, expected, tmp_path,
                                                                         capsys):
    """Every option may be spelled with dashes (as torchrun reads --nproc-per-node), and the
    positional config file may be named by --config."""
    config = tmp_path / "config.yaml"
    config.write_text("lr: 4.2e-3\neval_interval: 9\n")
    argv = [arg.replace("CONFIG", str(config)) for arg in argv]
    with pytest.raises(SystemExit) as stop:
        train_my_ddp.main([*argv, "--print-config", "json"])
    assert stop.value.code == 0
    printed = json.loads(capsys.readouterr().out)
    assert {name: printed[name] for name in expected} == expected


@pytest.mark.parametrize("argv, message", [
    (["--dataset_name", "org/name"], r"did you mean --data_dir\?.*--data_dir hf:org/name"),
    (["--use_peft"], r"did you mean --lora_rank\?.*--lora_rank 8"),
    (["--lora-target-modules=q_proj"], r"did you mean --lora_targets\?"),
    (["--packing"], r"did you mean --pack_samples\?"),
    (["--config"], r"--config needs a file: --config FILE"),
], ids=["dataset_name", "use_peft", "lora_target_modules", "packing", "config-without-file"])
def test_hf_and_trl_names_point_at_z2alls_options(argv, message, capsys):
    assert cli_run_main(train_my_ddp.main, argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
