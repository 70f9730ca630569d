"""Bad input is refused up front, in one line, with the right exit code; nothing is lost quietly.

Each row of `CASES` is a command line a careless or hostile user might type, with the fragment
its one-line error must contain and the exit code (2: bad input). The rows run in this process
through `utils.cli_errors.run_main`, which is exactly what each entry point's `__main__` does;
`test_real_entry_points` runs a few as subprocesses to check that wiring, `--debug` included.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import generate
import monitor_process
import train_my_ddp
from data_preprocess import build_pretrain_sample_index_map, pipeline, pretokenize_chat
from data_preprocess import pretokenize_pretrain_data as pretrain_cli
from data_preprocess.chat_records import RecordFormatError, dpo_messages, sft_messages
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.build import build_datasets
from dataset.chat_store import CACHE_DIR_NAME
from dataset.dataset_pretrain import PretokDatasetWithIndex
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from parallel.local_ranks import run_on_ranks
from tests.train_helpers import TINY_ARGS, data_args, tiny_training_data
from tokenizer import load_tokenizer, train_tokenizer
from tools import resplot
from trainer import training_checkpoint
from utils.checkpoint import list_checkpoints, verify_checkpoint
from utils.cli_errors import EXIT_BAD_INPUT, EXIT_RUNTIME_FAILURE, run_main
from utils.data_files import find_data_files
from utils.readers import iter_texts

REPO = Path(__file__).resolve().parents[1]
sft_cli = functools.partial(pretokenize_chat.main, "sft")


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_hf_tokenizer_dir) -> dict[str, Path]:
    return tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)


def one_line_error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), lines
    assert not any(line.startswith("Traceback") for line in lines), lines
    return lines[-1]


# (entry point, its arguments with {tmp}/{tok}/{pretok} placeholders, expected message)
CASES = [
    (train_my_ddp.main, ["--max_iters=-1"], "--max_iters must be >= 1, got -1"),
    (train_my_ddp.main, ["--max_iters=0"], "--max_iters must be >= 1"),
    (train_my_ddp.main, ["--stop_at_iter=0"], "--stop_at_iter must be >= 1"),
    (train_my_ddp.main, ["--lr=nan"], "--lr must be a finite number > 0, got nan"),
    (train_my_ddp.main, ["--lr=inf"], "--lr must be a finite number > 0, got inf"),
    (train_my_ddp.main, ["--hidden_size=0"], "--hidden_size must be >= 1"),
    (train_my_ddp.main, ["--grad_clip=nan"], "--grad_clip must be a finite number >= 0"),
    (train_my_ddp.main, ["--dpo_beta=0"], "--dpo_beta must be > 0"),
    (train_my_ddp.main, ["--dpo_label_smoothing=0.5"], "--dpo_label_smoothing must be in"),
    (train_my_ddp.main, ["--peak_flops=-1"], "--peak_flops must be > 0"),
    (train_my_ddp.main, ["--warmup_iters=-5"], "--warmup_iters must be >= 0"),
    (train_my_ddp.main, ["--lr=1e-3", "--min_lr=1e-2"], "--min_lr must be in [0, 0.001]"),
    (train_my_ddp.main, ["--lrr=1"], "did you mean --lr"),
    (train_my_ddp.main, ["--eval_prompts="], "--eval_prompts=[''] has an empty prompt"),
    (train_my_ddp.main, ["--data_format=stream", "--data_mix=web:1,books:nan"],
     "'books:nan' is not NAME:WEIGHT with a finite weight > 0"),
    (train_my_ddp.main, ["--seed=1e30"], "--seed must be in [0, "),
    (train_my_ddp.main, ["--zero_stage=3", "--compile"],
     "--compile cannot be combined with --zero_stage=3"),
    (train_my_ddp.main, ["--zero_stage=2", "--comm_hook=bf16"],
     "--comm_hook=bf16 cannot be combined with --zero_stage=2"),
    (train_my_ddp.main, ["--pipeline_parallel=2", "--comm_hook=powersgd"],
     "--comm_hook=powersgd with --tensor_parallel=1 --pipeline_parallel=2 is not supported "
     "yet: its per-rank state"),
    (train_my_ddp.main, ["--dist_timeout=1e300"], "--dist_timeout must be in (0, 10080]"),
    (train_my_ddp.main, ["--lora_rank=8"], "--lora_rank trains adapters on a pretrained model"),
    (train_my_ddp.main, ["--lora_rank=-1"], "--lora_rank must be >= 0 (0 = off), got -1"),
    (train_my_ddp.main, ["--lora_rank=8", "--lora_targets=q_proj,qkv"],
     "--lora_targets 'q_proj,qkv': choose from q_proj,k_proj"),
    (train_my_ddp.main, ["--data_dir={tmp}/nope", "--tokenizer_dir={tok}"],
     "--data_dir={tmp}/nope: no such file or directory"),
    (train_my_ddp.main, ["--data_dir={pretok}", "--tokenizer_dir={tok}", "--init_from={tmp}/no"],
     "--init_from={tmp}/no: no such file or directory"),
    (train_my_ddp.main, ["--data_dir={pretok}", "--tokenizer_dir={tok}", "--resume"],
     "--resume: {tmp}/run holds no run to continue"),
    (generate.main, ["--ckpt={tmp}/nothing", "--temperature=-1"], "--temperature must be >= 0"),
    (generate.main, ["--ckpt={tmp}/nothing", "--top_p=0"], "--top_p must be in (0, 1]"),
    (generate.main, ["--ckpt={tmp}/nothing", "--top_p=1.5"], "--top_p must be in (0, 1]"),
    (generate.main, ["--ckpt={tmp}/nothing", "--top_k=0"], "--top_k must be >= 1"),
    (generate.main, ["--ckpt={tmp}/nothing", "--max_new_tokens=-3"], "--max_new_tokens must be"),
    (generate.main, ["--ckpt={tmp}/nothing"], "no such checkpoint or run directory"),
    (pretrain_cli.main, ["--data_dir={tmp}", "--tokenizer_dir={tok}", "--batch_size=0"],
     "--batch_size must be >= 1, got 0"),
    (pretrain_cli.main, ["--data_dir={tmp}", "--tokenizer_dir={tok}", "--num_workers=-1"],
     "--num_workers must be >= 0"),
    (pretrain_cli.main, ["--data_dir={tmp}", "--tokenizer_dir={tmp}/no_tokenizer"],
     "tokenizer dir {tmp}/no_tokenizer does not exist"),
    (pretrain_cli.main, ["--data_dir={tmp}/no_data", "--tokenizer_dir={tok}"],
     "--data_dir {tmp}/no_data: no such file or directory"),
    (sft_cli, ["--data_dir={tmp}", "--tokenizer_dir={tok}", "--max_seq_len=-5"],
     "--max_seq_len must be >= 2, got -5"),
    (sft_cli, ["--data_dir={tmp}", "--tokenizer_dir={tok}", "--max_seq_len=0"],
     "--max_seq_len must be >= 2, got 0"),
    (build_pretrain_sample_index_map.main, ["--data_dir={pretok}", "--max_seq_len=8",
                                            "--valid_ratio=1"], "--valid_ratio must be in [0, 1)"),
    (build_pretrain_sample_index_map.main, ["--data_dir={pretok}", "--max_seq_len=8",
                                            "--valid_ratio=-0.1"], "--valid_ratio must be in"),
    (train_tokenizer.main, ["--type=hf", "--input={tmp}/blank.txt", "--vocab_size=300",
                            "--out={tmp}/t"], "no text found in {tmp}/blank.txt"),
    (train_tokenizer.main, ["--type=hf", "--input={tmp}", "--vocab_size=100", "--out={tmp}/t"],
     "--vocab_size must be >= 259"),
    (train_tokenizer.main, ["--type=hf", "--input={tok}", "--vocab_size=300", "--out={tmp}"],
     "--out {tmp} holds blank.txt, which train_tokenizer did not write"),
    (train_tokenizer.main, ["--type=hf", "--input={tmp}", "--vocab_size=300", "--out={tmp}"],
     "--out {tmp} is the input --input {tmp}"),
    (train_tokenizer.main, ["--type=hf", "--input={tmp}", "--vocab_size=300",
                            "--out={tmp}/sub/t"],
     "--out {tmp}/sub/t lies inside the input --input {tmp}"),
    (generate.main, ["--ckpt={tmp}/nothing", "--device=cuda:99"], "--device cuda:99: "),
    (generate.main, ["--ckpt={tmp}/nothing", "--device=gpu"], "--device gpu: not a device name"),
    (resplot.main, ["{tmp}/no_run"], "run directory does not exist: {tmp}/no_run"),
    (train_my_ddp.main, [*TINY_ARGS, "--task_type=sft", "--data_dir={pretok}",
                         "--tokenizer_dir={tok}"],
     "this is pretokenized pretraining data, not sft records (use --task_type=pretrain"),
]


@pytest.mark.parametrize("main, argv, expected", CASES,
                         ids=[f"{case[0].__module__}:{' '.join(case[1])}"[:70] for case in CASES])
def test_bad_input_is_one_line_and_exit_2(main, argv, expected, tmp_path, capsys, data):
    values = {"tmp": tmp_path, "tok": data["tokenizer"], "pretok": data["pretrain"]}
    (tmp_path / "blank.txt").write_text("\n\n")
    run_dir = tmp_path / "run"
    argv = [arg.format(**values) for arg in argv]
    if main is train_my_ddp.main:
        argv.append(f"--out_dir={run_dir}")
    assert run_main(main, argv) == EXIT_BAD_INPUT
    assert expected.format(**values) in one_line_error(capsys)
    assert not run_dir.exists()  # refused before any work


@pytest.mark.parametrize("argv, expected", [
    (["--max_restarts", "-1"], "--max_restarts must be >= 0, got -1"),
    (["--restart_delay", "-1", "--kill_grace", "-2"], "--restart_delay must be >= 0, got -1.0; "
                                                      "--kill_grace must be >= 0"),
])
def test_monitor_refuses_negative_counts_and_delays(argv, expected, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        monitor_process.main([*argv, "--out_dir", str(tmp_path / "run"), "--", "true"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_bad_record_is_located_by_file_and_line(tmp_path, capsys, tiny_hf_tokenizer_dir):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text('{"text": "fine"}\n{"text" "broken"}\n')
    argv = [f"--data_dir={tmp_path / 'raw'}", f"--tokenizer_dir={tiny_hf_tokenizer_dir}",
            "--num_workers=0"]
    assert run_main(pretrain_cli.main, argv) == EXIT_BAD_INPUT
    assert f"{tmp_path / 'raw' / 'a.jsonl'}:2: malformed_json" in one_line_error(capsys)


def test_real_entry_points(tmp_path):
    """The `__main__` wiring of two CLIs: one line and exit 2; `--debug` shows the traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "train_my_ddp.py", "--lr=nan", f"--out_dir={tmp_path / 'run'}"]
    result = subprocess.run(run, cwd=REPO, capture_output=True, text=True, env=env)
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip() == "error: --lr must be a finite number > 0, got nan"
    result = subprocess.run([*run, "--debug"], cwd=REPO, capture_output=True, text=True, env=env)
    assert result.returncode == 1 and "Traceback" in result.stderr
    assert "ValueError: --lr must be a finite number > 0, got nan" in result.stderr
    result = subprocess.run([sys.executable, "-m", "data_preprocess.pretokenize_sft_data",
                             "--data_dir=x", "--tokenizer_dir=y", "--max_seq_len=-5"],
                            cwd=REPO, capture_output=True, text=True, env=env)
    assert (result.returncode, result.stderr.strip()) == (
        EXIT_BAD_INPUT, "error: --max_seq_len must be >= 2, got -5")


def test_disk_full_names_the_checkpoint_and_the_intact_one(tmp_path, capsys, data, monkeypatch):
    """ENOSPC on the second checkpoint: exit 1, one line naming both; the first still verifies."""
    real_save = training_checkpoint._save_torch
    saves: list[Path] = []

    def save_until_the_disk_fills(obj, path):
        saves.append(path)
        if len(saves) > 2:  # two files per checkpoint on one rank: the second checkpoint fails
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(training_checkpoint, "_save_torch", save_until_the_disk_fills)
    run_dir = tmp_path / "run"
    argv = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}", "--max_iters=4",
            "--save_interval=2", "--eval_interval=2", "--eval_at_start=false"]
    assert run_main(train_my_ddp.main, argv) == EXIT_RUNTIME_FAILURE
    first = run_dir / "ckpt" / "step_000002"
    assert one_line_error(capsys) == (
        f"error: no space left on device while writing {run_dir / 'ckpt' / '.tmp_step_000004'}"
        f"; the previous checkpoint {first} is intact")
    assert [path for _, path in list_checkpoints(run_dir / "ckpt")] == [first]
    assert verify_checkpoint(first) is None


def test_disk_full_inside_torch_save_is_the_disk_full_message(tmp_path, capsys, data,
                                                               monkeypatch):
    """torch's C++ writer reports a failed write as a RuntimeError whose context is the
    OSError(ENOSPC) (what `torch.save` into /dev/full raises); it must read as a full disk."""
    real_save = torch.save
    rank_files: list[object] = []

    def save_until_the_disk_fills(obj, handle):
        if isinstance(obj, dict) and "rng" in obj:
            rank_files.append(handle)
        if len(rank_files) > 1:  # the second checkpoint's rank file
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:  # torch's writer leaves the OSError as the context
                raise RuntimeError("[enforce fail at inline_container.cc:672] . "  # noqa: B904
                                   "unexpected pos 704 vs 598")
        real_save(obj, handle)

    monkeypatch.setattr(torch, "save", save_until_the_disk_fills)
    run_dir = tmp_path / "run"
    argv = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}", "--max_iters=4",
            "--save_interval=2", "--eval_interval=2", "--eval_at_start=false"]
    assert run_main(train_my_ddp.main, argv) == EXIT_RUNTIME_FAILURE
    assert one_line_error(capsys) == (
        f"error: no space left on device while writing {run_dir / 'ckpt' / '.tmp_step_000004'}"
        f"; the previous checkpoint {run_dir / 'ckpt' / 'step_000002'} is intact")


def _rank_0_disk_fills(rank: int, world_size: int, argv: list[str]) -> int:
    """On rank 0 the second checkpoint's model weights hit a full disk; rank 1 writes fine."""
    torch.set_num_threads(1)
    if rank == 0:
        from model.modeling_z2all import Z2allForCausalLM as model_class

        real_save = model_class.save_pretrained
        calls = []

        def save_until_the_disk_fills(self, directory):
            calls.append(directory)
            if len(calls) > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_save(self, directory)

        model_class.save_pretrained = save_until_the_disk_fills
    return run_main(train_my_ddp.main, argv)


def test_a_write_failing_on_one_rank_stops_every_rank(tmp_path, data):
    """Rank 0 alone fails to write: both ranks end with exit 1 (within the test's timeout, far
    below the process group's) instead of rank 1 waiting for rank 0 at a barrier."""
    run_dir = tmp_path / "run"
    argv = [*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}", "--max_iters=4",
            "--save_interval=2", "--eval_interval=2", "--eval_at_start=false"]
    codes = run_on_ranks(_rank_0_disk_fills, argv, world_size=2, timeout=240,
                         collective_timeout_s=600)
    assert codes == [EXIT_RUNTIME_FAILURE, EXIT_RUNTIME_FAILURE]
    assert [step for step, _ in list_checkpoints(run_dir / "ckpt")] == [2]


# ------------------------------------------------------------------ low-severity items

@pytest.mark.parametrize("messages, position", [
    ([{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}], 0),
    ([{"role": "user", "content": "q"}, {"role": "user", "content": "q"},
      {"role": "assistant", "content": "a"}], 1),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
      {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "a"}], 3),
])
def test_sft_turn_order_is_checked(messages, position):
    with pytest.raises(RecordFormatError, match=f"message {position} is"):
        sft_messages({"messages": messages})
    with pytest.raises(RecordFormatError, match="bad_turn_order"):
        dpo_messages({"prompt": messages, "chosen": "c", "rejected": "r"})
    fine = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"}]
    assert sft_messages({"messages": fine}) == fine


def test_sft_turn_order_error_names_file_and_line(tmp_path, capsys, tiny_hf_tokenizer_dir):
    (tmp_path / "sft").mkdir()
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"messages": [{"role": "assistant", "content": "a"}]}
    (tmp_path / "sft" / "x.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    argv = [f"--data_dir={tmp_path / 'sft'}", f"--tokenizer_dir={tiny_hf_tokenizer_dir}",
            "--max_seq_len=64", "--num_workers=0"]
    assert run_main(sft_cli, argv) == EXIT_BAD_INPUT
    assert "x.jsonl:2: bad_turn_order" in one_line_error(capsys)


def test_unsupported_data_files_are_reported(tmp_path, capsys):
    for name in ("a.jsonl", "b.csv", "c.jsonl.gz", "d.ndjson", "notes.md"):
        (tmp_path / name).write_text('{"text": "x"}\n')
    assert find_data_files(tmp_path) == [tmp_path / "a.jsonl"]
    assert ("skipping 3 files of unsupported type: b.csv, c.jsonl.gz, d.ndjson"
            in capsys.readouterr().err)


def test_json_errors_do_not_say_at_at(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "a\tb"}\n')
    with pytest.raises(ValueError) as error:
        list(iter_texts(tmp_path / "a.jsonl", ["text"]))
    assert "Invalid control character at column" in str(error.value)
    assert "at at" not in str(error.value)


def test_empty_sft_file_says_there_is_nothing_to_train_on(tmp_path, tiny_hf_tokenizer_dir):
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no samples to train on"):
        build_datasets("sft", tmp_path / "sft", load_tokenizer(tiny_hf_tokenizer_dir),
                       32, num_workers=0)


def test_out_of_vocabulary_ids_name_the_file(tmp_path, data):
    build_datasets("pretrain", data["pretrain"], load_tokenizer(data["tokenizer"]), 32)  # index
    dataset = PretokDatasetWithIndex(data["pretrain"], 32, "train")
    biggest = max(int(dataset[i]["input_ids"].max()) for i in range(20))
    small_vocab = PretokDatasetWithIndex(data["pretrain"], 32, "train", vocab_size=biggest)
    with pytest.raises(ValueError, match=r"\.bin: token id \d+ .* outside the tokenizer's"):
        for i in range(20):
            small_vocab[i]
    exact = PretokDatasetWithIndex(data["pretrain"], 32, "train", vocab_size=biggest + 1)
    assert all(torch.equal(exact[i]["input_ids"], dataset[i]["input_ids"]) for i in range(20))


def test_a_done_file_with_zero_documents_is_redone(tmp_path, tiny_hf_tokenizer_dir, capsys):
    """What `--batch_size 0` used to leave behind: a sidecar saying "done, 0 documents"."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    out = tmp_path / "pretok"
    first = pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, out, num_workers=0)
    assert first["num_documents"] == 2
    sidecar_path = out / "a.json"
    sidecar = json.loads(sidecar_path.read_text())
    sidecar_path.write_text(json.dumps({**sidecar, "num_documents": 0, "num_tokens": 0}))
    again = pretokenize_pretrain_data(tmp_path / "raw", tiny_hf_tokenizer_dir, out, num_workers=0)
    assert (again["files_reused"], again["num_documents"]) == (0, 2)
    note = "records 0 documents read from a non-empty a.jsonl; redoing it"
    assert note in capsys.readouterr().out
    with pytest.raises(ValueError, match="--batch_size must be >= 1"):
        pipeline.check_options(num_workers=0, batch_size=0)


def test_model_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path, capsys, data):
    small = Z2allForCausalLM(Z2allConfig.from_preset("tiny", vocab_size=64, hidden_size=32,
                                                     num_hidden_layers=1, num_attention_heads=2,
                                                     num_key_value_heads=1))
    small.save_pretrained(tmp_path / "small")
    run_dir = tmp_path / "run"
    argv = [*TINY_ARGS, *data_args(data, "sft"), f"--init_from={tmp_path / 'small'}",
            f"--out_dir={run_dir}", "--max_iters=2"]
    assert run_main(train_my_ddp.main, argv) == EXIT_BAD_INPUT
    assert "embeds only 64: not its tokenizer" in one_line_error(capsys)
    assert not (run_dir / "ckpt").exists() and not (run_dir / "heartbeat").exists()


@pytest.mark.parametrize("task_type", ["sft", "dpo"])
def test_chat_task_on_pretraining_tokens_is_refused_without_a_cache(task_type, data):
    with pytest.raises(ValueError, match="this is pretokenized pretraining data"):
        build_datasets(task_type, data["pretrain"], load_tokenizer(data["tokenizer"]),
                       32, num_workers=0)
    assert not (data["pretrain"] / CACHE_DIR_NAME).exists()
