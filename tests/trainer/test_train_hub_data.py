"""Raw data named by Hub id (`hf:org/name`, from an offline HF cache the test builds) or given as
`datasets` save_to_disk folders, in the trainer: `--data_format=stream` and online SFT train on
it exactly as on the same records in local .jsonl files (the same losses, step by step);
online SFT/DPO render the same samples (a Hub dataset's cached outside the HF cache);
pretraining a Hub id without the stream, or an id not in the cache, is refused in one line."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

import train_my_ddp
from dataset.build import build_datasets
from tests.hf_cache_helpers import parquet_bytes, put_dataset_in_hf_cache, use_offline_hf_cache
from tests.train_helpers import TINY_ARGS, run_main, train_losses
from tokenizer import load_tokenizer
from utils.cli_errors import run_main as cli_run_main
from utils.readers import iter_records

STREAMED = "bilingual_zh_en.jsonl"  # one shard of the tiny pretraining data


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user_cache"))  # online SFT's cache
    return use_offline_hf_cache(tmp_path / "hf_home", monkeypatch)


def stream_losses(data, data_dir, out_dir) -> dict[int, float]:
    assert run_main([*TINY_ARGS, "--task_type=pretrain", "--data_format=stream",
                     f"--data_dir={data_dir}", f"--tokenizer_dir={data['tokenizer']}",
                     "--shuffle_buffer=4", "--max_iters=3", "--eval_interval=3",
                     "--eval_prompts=[]", f"--out_dir={out_dir}"]) == 0
    return train_losses(out_dir)


@pytest.mark.filterwarnings("ignore:.*no validation samples")  # a shard of under 100 records
def test_the_stream_reads_a_hub_id_and_a_save_to_disk_folder_as_their_jsonl(data, hub_cache,
                                                                            tmp_path):
    datasets = pytest.importorskip("datasets")
    local = tmp_path / "local"
    local.mkdir()
    shutil.copy(data["pretrain_raw"] / STREAMED, local)
    records = [record.data for record in iter_records(local / STREAMED)]
    assert [record.number for record in iter_records(local / STREAMED)] == \
        list(range(1, len(records) + 1))  # no blank lines: record n is line n
    put_dataset_in_hf_cache(hub_cache, "org/pretrain", {
        "data/train-00000-of-00001.parquet": parquet_bytes(pa.Table.from_pylist(records)),
        "data/test-00000-of-00001.parquet": parquet_bytes(pa.table({"text": ["held out"]}))})
    datasets.Dataset.from_list(records).save_to_disk(tmp_path / "saved")
    expected = stream_losses(data, local, tmp_path / "run_local")
    assert len(expected) == 3
    assert stream_losses(data, "hf:org/pretrain", tmp_path / "run_hub") == expected
    assert stream_losses(data, tmp_path / "saved", tmp_path / "run_saved") == expected


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_online_sft_and_dpo_render_a_hub_dataset_as_its_train_files(kind, data, hub_cache,
                                                                    tmp_path):
    """The repository holds the demo's train_*.jsonl and valid.jsonl: the `train` split is the
    former, all of it trained on, and the `validation` split the latter, the same samples as a
    folder of those files (where valid.jsonl is validation by its name); one save_to_disk
    folder per train file has no validation split, and holds out part of train as a folder of
    just those files does. The rendered cache lives in ~/.cache/z2all ($XDG_CACHE_HOME), not
    in the HF cache."""
    datasets = pytest.importorskip("datasets")
    files = sorted(data[kind].glob("*.jsonl"))
    snapshot = put_dataset_in_hf_cache(hub_cache, f"org/{kind}",
                                       {path.name: path.read_text() for path in files})
    train_only, with_valid = tmp_path / "local", tmp_path / "local_with_valid"
    train_only.mkdir()
    with_valid.mkdir()
    for path in files:
        shutil.copy(path, with_valid)
        if path.name.startswith("train"):
            shutil.copy(path, train_only)
            records = [record.data for record in iter_records(path)]
            datasets.Dataset.from_list(records).save_to_disk(tmp_path / "saved" / path.stem)
    for source, local in ((f"hf:org/{kind}", with_valid), (tmp_path / "saved", train_only)):
        expected = build_datasets(kind, local, load_tokenizer(data["tokenizer"]), 64, num_workers=0)
        got = build_datasets(kind, source, load_tokenizer(data["tokenizer"]), 64, num_workers=0)
        for got_split, expected_split in zip(got[:2], expected[:2]):
            assert len(got_split) == len(expected_split) > 0
            for index in (0, len(got_split) - 1):
                assert {key: value.tolist() for key, value in got_split[index].items()} == \
                    {key: value.tolist() for key, value in expected_split[index].items()}
    assert list((tmp_path / "user_cache/z2all" / f"org--{kind}").glob(f"{kind}_*/DONE.json"))
    assert not list(snapshot.rglob(".z2all_cache"))


def test_online_sft_trains_on_a_hub_id_as_on_its_files(data, hub_cache, tmp_path):
    put_dataset_in_hf_cache(hub_cache, "org/sft", {
        path.name: path.read_text() for path in data["sft"].glob("*.jsonl")})
    local = tmp_path / "local"
    local.mkdir()
    for path in data["sft"].glob("*.jsonl"):  # valid.jsonl: validation here, as on the Hub
        shutil.copy(path, local)
    args = [*TINY_ARGS, "--task_type=sft", f"--tokenizer_dir={data['tokenizer']}",
            "--max_iters=2", "--eval_interval=2", "--eval_prompts=[]"]
    assert run_main([*args, "--data_dir=hf:org/sft", f"--out_dir={tmp_path / 'hub'}"]) == 0
    assert run_main([*args, f"--data_dir={local}", f"--out_dir={tmp_path / 'local_run'}"]) == 0
    assert train_losses(tmp_path / "hub") == train_losses(tmp_path / "local_run")


@pytest.mark.parametrize("extra, message", [
    ([], "--data_dir=hf:org/pretrain names raw records: pretrain on them with "
         "--data_format=stream, or pretokenize them first"),
    (["--data_format=stream", "--data_dir=hf:org/missing"],
     "--data_dir hf:org/missing: no Hugging Face dataset 'org/missing' in the HF cache"),
])
def test_a_hub_id_the_trainer_cannot_use_is_one_line(extra, message, data, hub_cache, tmp_path,
                                                      capsys):
    argv = [*TINY_ARGS, "--task_type=pretrain", "--data_dir=hf:org/pretrain",
            f"--tokenizer_dir={data['tokenizer']}", f"--out_dir={tmp_path / 'run'}", *extra]
    assert cli_run_main(train_my_ddp.main, argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and error.count("\n") == 1
    assert not (tmp_path / "run").exists()
