"""tools.evaluate: loss / perplexity / bits per byte equal to the trainer's eval on the same data
(built by the offline pretokenizer + sample index, as a training run would), a run's own data
dir scored on its validation split equal to the run's val_loss, the CLI's report.md /
evaluations.json, --limit, the progress bar's total, and its one-line refusals."""

from __future__ import annotations

import json
import logging
import random

import pyarrow as pa
import pytest
import torch
from torch.utils.data import default_collate

from data.toy_corpus import multilingual_corpus
from data_preprocess.build_pretrain_sample_index_map import build_sample_index
from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from dataset.dataset_pretrain import PretokDatasetWithIndex
from model.configuration_z2all import Z2allConfig
from model.modeling_z2all import Z2allForCausalLM
from tests.hf_cache_helpers import parquet_bytes, put_dataset_in_hf_cache, use_offline_hf_cache
from tests.train_helpers import TINY_ARGS, data_args, run_main, tiny_training_data
from tokenizer import load_tokenizer
from tools import evaluate
from trainer.distributed_env import DistributedEnv
from trainer.evaluation import eval_loader, evaluate_language_model
from trainer.metrics import read_metrics
from utils.checkpoint import save_checkpoint
from utils.cli_errors import EXIT_BAD_INPUT
from utils.cli_errors import run_main as cli_run_main
from utils.run_directory import MARKER

SEQ_LEN = 24
torch.set_num_threads(1)  # the test machine is small and shared


def tiny_model(tokenizer, seed: int) -> Z2allForCausalLM:
    torch.manual_seed(seed)
    config = Z2allConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         max_position_embeddings=64, initializer_range=0.1)
    return Z2allForCausalLM(config).eval()


def write_raw_data(directory, seed: int) -> None:
    """Two files of random multilingual documents (one .jsonl, one .txt), a few blank ones."""
    directory.mkdir()
    texts = multilingual_corpus(num_documents=30, seed=seed)
    with open(directory / "a.jsonl", "w", encoding="utf-8") as handle:
        for text in texts[:18]:
            handle.write(json.dumps({"text": text if random.random() > 0.1 else ""}) + "\n")
    (directory / "b.txt").write_text("\n".join(t.replace("\n", " ") for t in texts[18:]) + "\n",
                                     encoding="utf-8")


def trainer_figures(raw_dir, pretok_dir, tokenizer_dir, model, tokenizer, batch_size):
    """The trainer's path: pretokenize, index every window as train (no valid split), then
    the trainer's eval loader and evaluate_language_model over all of them."""
    pretokenize_pretrain_data(raw_dir, tokenizer_dir, out_dir=pretok_dir, num_workers=1)
    build_sample_index(pretok_dir, SEQ_LEN, valid_samples=0)
    dataset = PretokDatasetWithIndex(pretok_dir, SEQ_LEN, split="train")
    env = DistributedEnv(0, 1, 0, 1, torch.device("cpu"))
    loader = eval_loader(dataset, default_collate, batch_size, len(dataset), env)
    return evaluate_language_model(model, loader, tokenizer, env), len(dataset)


@pytest.mark.parametrize("batch_size", [3, 5])
def test_figures_equal_the_trainers_eval_on_the_same_data(tmp_path, tiny_hf_tokenizer_dir,
                                                          batch_size):
    seed = random.randrange(1000)
    write_raw_data(tmp_path / "raw", seed)
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = tiny_model(tokenizer, seed)
    expected, num_windows = trainer_figures(tmp_path / "raw", tmp_path / "pretok",
                                            tiny_hf_tokenizer_dir, model, tokenizer, batch_size)
    got = evaluate.language_model_metrics(model, tokenizer, [str(tmp_path / "raw")], SEQ_LEN,
                                          batch_size, ["text"], torch.device("cpu"))
    assert num_windows > 2 * batch_size and got["tokens"] == num_windows * SEQ_LEN
    assert got["tokens"] == expected["val_tokens"]
    assert got["loss"] == pytest.approx(expected["val_loss"], rel=1e-5)
    assert got["perplexity"] == pytest.approx(expected["val_ppl"], rel=1e-5)
    assert got["bits_per_byte"] == pytest.approx(expected["val_bpb"], rel=1e-5)


def test_cli_appends_a_table_to_report_md_and_the_figures_to_evaluations_json(
        tmp_path, tiny_hf_tokenizer_dir, capsys):
    write_raw_data(tmp_path / "raw", seed=7)
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = tiny_model(tokenizer, seed=7)
    model.save_pretrained(tmp_path / "model")
    expected = evaluate.language_model_metrics(model, tokenizer, [str(tmp_path / "raw")],
                                               SEQ_LEN, 4, ["text"], torch.device("cpu"))
    report_dir = tmp_path / "report"
    argv = ["--ckpt", str(tmp_path / "model"), "--tokenizer_dir", str(tiny_hf_tokenizer_dir),
            "--data", str(tmp_path / "raw"), "--seq_len", str(SEQ_LEN), "--batch_size", "4",
            "--dtype", "fp32", "--device", "cpu", "--report_dir", str(report_dir)]
    for _ in range(2):
        evaluate.main(argv)
    history = json.loads((report_dir / "evaluations.json").read_text())
    assert len(history) == 2
    for entry in history:
        assert entry["title"] == "language modelling"
        assert entry["scores"]["data"] == pytest.approx(expected, rel=1e-6)
    report = (report_dir / "report.md").read_text()
    assert report.count(evaluate.EVALUATIONS_MARKER) == 1
    assert report.count("## Evaluation: language modelling") == 2
    assert f"| data | {expected['bits_per_byte']:.4g} | {expected['loss']:.4g} |" in report


@pytest.mark.parametrize("extra, message", [
    ([], "nothing to evaluate"),
    (["--data", "x.jsonl", "--batch_size", "0"], "--batch_size"),
])
def test_bad_options_are_refused_before_loading(extra, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        evaluate.main(["--ckpt", str(tmp_path / "missing"), *extra])


def test_data_without_files_is_refused(tmp_path, tiny_hf_tokenizer_dir):
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .jsonl/.json/.parquet/.txt files"):
        evaluate.language_model_metrics(tiny_model(tokenizer, 0), tokenizer,
                                        [str(tmp_path / "empty")], SEQ_LEN, 2, ["text"],
                                        torch.device("cpu"))


def cli_argv(model_dir, tokenizer_dir, data, report_dir, *extra) -> list[str]:
    return ["--ckpt", str(model_dir), "--tokenizer_dir", str(tokenizer_dir), "--data",
            str(data), "--batch_size", "4", "--dtype", "fp32", "--device", "cpu",
            "--report_dir", str(report_dir), *extra]


def test_seq_len_beyond_the_models_positions_is_one_line(tmp_path, tiny_hf_tokenizer_dir,
                                                         capsys):
    write_raw_data(tmp_path / "raw", seed=3)
    tiny_model(load_tokenizer(tiny_hf_tokenizer_dir), seed=3).save_pretrained(tmp_path / "model")
    argv = cli_argv(tmp_path / "model", tiny_hf_tokenizer_dir, tmp_path / "raw",
                    tmp_path / "report", "--seq_len", "65")  # the model has 64 positions
    assert cli_run_main(evaluate.main, argv) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: --seq_len 65") and "max_position_embeddings (64)" in error
    assert not (tmp_path / "report").exists()


def test_limit_caps_the_windows_and_the_bar_counts_what_is_read(tmp_path,
                                                                 tiny_hf_tokenizer_dir, capsys):
    write_raw_data(tmp_path / "raw", seed=5)
    tiny_model(load_tokenizer(tiny_hf_tokenizer_dir), seed=5).save_pretrained(tmp_path / "model")
    argv = cli_argv(tmp_path / "model", tiny_hf_tokenizer_dir, tmp_path / "raw",
                    tmp_path / "report", "--seq_len", str(SEQ_LEN))
    evaluate.main(argv)
    assert "100%" in capsys.readouterr().err  # a total is known (bytes), so a percentage
    evaluate.main([*argv, "--limit", "3"])
    last_bar = capsys.readouterr().err.rsplit("\r", 1)[-1]  # counts the 3 windows, not the bytes
    assert "100%" in last_bar and "3/3" in last_bar and "window" in last_bar, last_bar
    evaluate.main([*argv, "--max_batches", "1"])  # 1 batch of --batch_size 4
    last_bar = capsys.readouterr().err.rsplit("\r", 1)[-1]
    assert "100%" in last_bar and "4/4" in last_bar, last_bar
    whole, limited, one_batch = json.loads(
        (tmp_path / "report" / "evaluations.json").read_text())
    assert whole["scores"]["data"]["tokens"] > 4 * SEQ_LEN
    assert limited["scores"]["data"]["tokens"] == 3 * SEQ_LEN
    assert one_batch["scores"]["data"]["tokens"] == 4 * SEQ_LEN
    assert limited["settings"]["limit"] == 3


def test_a_runs_data_dir_scores_its_validation_split_as_the_trainer_does(
        tmp_path, tmp_path_factory, tiny_hf_tokenizer_dir, capsys):
    data = tiny_training_data(tmp_path_factory.getbasetemp(), tiny_hf_tokenizer_dir)
    run_dir = tmp_path / "run"
    # --eval_iters global batches cover the whole valid split: the trainer scores all of it.
    assert run_main([*TINY_ARGS, *data_args(data, "pretrain"), f"--out_dir={run_dir}",
                     "--max_iters=2", "--eval_iters=1000"]) == 0
    (last_eval,) = [r for r in read_metrics(run_dir) if r["kind"] == "eval" and r["step"] == 2]
    capsys.readouterr()
    evaluate.main(["--ckpt", str(run_dir), "--data", str(data["pretrain"]), "--dtype", "fp32",
                   "--device", "cpu", "--batch_size", "5"])
    assert "100%" in capsys.readouterr().err
    (entry,) = json.loads((run_dir / "evaluations.json").read_text())
    figures = entry["scores"]["data"]
    assert figures["loss"] == pytest.approx(last_eval["val_loss"], rel=1e-5)
    assert figures["bits_per_byte"] == pytest.approx(last_eval["val_bpb"], rel=1e-5)


def test_a_hub_dataset_and_a_dataset_dict_are_scored_on_their_validation_split(
        tmp_path, monkeypatch, capsys, tiny_hf_tokenizer_dir):
    """`--data hf:org/name` (an offline HF cache) and a DatasetDict save_to_disk folder give the
    figures of their validation texts as a .jsonl; an id not in the cache is one line naming
    --data."""
    datasets = pytest.importorskip("datasets")
    texts = multilingual_corpus(num_documents=40, seed=3)
    train, valid = {"text": texts[:20]}, {"text": texts[20:]}
    (tmp_path / "valid.jsonl").write_text("".join(json.dumps({"text": text}) + "\n"
                                                  for text in valid["text"]))
    hub_cache = use_offline_hf_cache(tmp_path / "hf_home", monkeypatch)
    put_dataset_in_hf_cache(hub_cache, "org/texts", {
        "data/train-00000-of-00001.parquet": parquet_bytes(pa.table(train)),
        "data/validation-00000-of-00001.parquet": parquet_bytes(pa.table(valid))})
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(train),
                          "validation": datasets.Dataset.from_dict(valid)}
                         ).save_to_disk(tmp_path / "saved")
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    model = tiny_model(tokenizer, seed=3)

    def figures(data: str) -> dict[str, float]:
        return evaluate.language_model_metrics(model, tokenizer, [data], SEQ_LEN, 4, ["text"],
                                               torch.device("cpu"))
    expected = figures(str(tmp_path / "valid.jsonl"))
    assert expected["tokens"] > 0
    assert figures("hf:org/texts") == pytest.approx(expected, rel=1e-6)
    assert figures(str(tmp_path / "saved")) == pytest.approx(expected, rel=1e-6)
    model.save_pretrained(tmp_path / "model")
    argv = cli_argv(tmp_path / "model", tiny_hf_tokenizer_dir, "hf:org/nothing",
                    tmp_path / "report", "--seq_len", str(SEQ_LEN))
    capsys.readouterr()
    assert cli_run_main(evaluate.main, argv) == EXIT_BAD_INPUT
    error = capsys.readouterr().err  # after the model's loading notes
    assert error.splitlines()[-1].startswith("error: --data hf:org/nothing: no Hugging Face "
                                             "dataset") and "Traceback" not in error


@pytest.mark.parametrize("ckpt, report_dir, reason", [
    ("model", None, "is not a z2all run or one of its checkpoints"),
    ("run", None, "its run run holds notes.txt, which no z2all run writes"),
    ("model", "model/results", "--report_dir model/results is inside --ckpt model"),
    ("model", "raw", "--report_dir raw is or contains --data raw"),
    ("model", ".", "--report_dir . is or contains --ckpt model"),
    ("model", "notes", "--report_dir notes holds todo.txt, which tools.evaluate does not write"),
], ids=["model-dir", "users-run", "inside-model", "the-data", "above-inputs", "foreign"])
def test_results_go_only_into_a_run_a_new_or_empty_dir_or_earlier_results(
        tmp_path, tiny_hf_tokenizer_dir, capsys, monkeypatch, ckpt, report_dir, reason):
    """Was: without --report_dir, report.md and evaluations.json were written into the HF
    model's directory (or a run holding a user's files); a --report_dir inside the model or
    holding a user's files was taken."""
    write_raw_data(tmp_path / "raw", seed=5)
    model = tiny_model(load_tokenizer(tiny_hf_tokenizer_dir), seed=5)
    model.save_pretrained(tmp_path / "model")
    save_checkpoint(tmp_path / "run" / "ckpt", 1, model.save_pretrained)
    (tmp_path / "run" / "z2all_run.json").write_text(json.dumps(MARKER))
    (tmp_path / "run" / "notes.txt").write_text("mine")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    argv = ["--ckpt", ckpt, "--tokenizer_dir", str(tiny_hf_tokenizer_dir), "--data", "raw",
            "--seq_len", str(SEQ_LEN), "--dtype", "fp32", "--device", "cpu",
            *(["--report_dir", report_dir] if report_dir else [])]
    assert cli_run_main(evaluate.main, argv) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert reason in error, error
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
def test_lm_eval_runs_quietly_with_one_line_of_ours(tmp_path, tiny_hf_tokenizer_dir, capsys,
                                                    caplog):
    """lm-eval's INFO log (seeds, task list, "Building contexts") and its advice for its own
    command line (`--metadata`) are not shown; one line of ours says what runs."""
    tiny_model(load_tokenizer(tiny_hf_tokenizer_dir), seed=7).save_pretrained(tmp_path / "model")
    caplog.set_level(logging.INFO)
    evaluate.main(["--ckpt", str(tmp_path / "model"), "--tokenizer_dir",
                   str(tiny_hf_tokenizer_dir), "--lm_eval", "z2all_demo_choice", "--limit", "2",
                   "--dtype", "fp32", "--device", "cpu", "--report_dir", str(tmp_path / "r")])
    from_lm_eval = [record for record in caplog.records if record.name.startswith("lm_eval")]
    assert not [r for r in from_lm_eval if r.levelno < logging.WARNING], from_lm_eval
    assert not [r for r in from_lm_eval if "--metadata" in r.getMessage()], from_lm_eval
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lm-eval:")]
    assert ours == ["lm-eval: z2all_demo_choice, at most 2 items each; its INFO log (seeds, "
                    "task list) and --metadata advice are off"]
    assert not logging.getLogger("lm_eval").level  # restored
