"""utils/data_files.py: which files a data option names. Hub datasets `hf:org/name[:config]
[@split]` from a hand-built offline HF cache (split by file names, by the dataset card's configs,
configs as folders), `DIR@split`, the `datasets` cache's folders; a missing id is one line
naming the option, a bad record names its file and line; a loading script is never run."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from data_preprocess import pretokenize_pretrain_data
from tests.hf_cache_helpers import parquet_bytes, put_dataset_in_hf_cache, use_offline_hf_cache
from utils.cli_errors import run_main
from utils.data_files import iter_texts_from, locate_data, mix_source, validation_spec
from utils.dataset_splits import EVAL_SPLITS
from utils.readers import BadRecordError

CARD = """---
license: mit
configs:
- config_name: small
  data_files:
  - split: train
    path: small/part-a-*.parquet
  - split: test
    path: small/holdout.jsonl
- config_name: large
  default: true
  data_files: "large/*.jsonl"
---
# A dataset card
"""


def jsonl(*texts: str) -> str:
    return "".join(json.dumps({"text": text}) + "\n" for text in texts)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    return use_offline_hf_cache(tmp_path / "hf_home", monkeypatch)


def names(spec: str, **kwargs) -> list[str]:
    return locate_data(spec, **kwargs).relative_names()


def test_a_hub_dataset_is_split_by_its_file_names(hub_cache):
    put_dataset_in_hf_cache(hub_cache, "org/named", {
        "README.md": "# no configs here\n",
        "data/train-00000-of-00002.parquet": parquet_bytes(pa.table({"text": ["a"]})),
        "data/train-00001-of-00002.parquet": parquet_bytes(pa.table({"text": ["b"]})),
        "data/test-00000-of-00001.jsonl": jsonl("t"),
        "dev/part.jsonl": jsonl("v"),
        "dataset_infos.csv": "not data we read\n"})
    train = ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    assert names("hf:org/named") == train
    assert names("hf:org/named", splits=EVAL_SPLITS) == ["dev/part.jsonl"]  # validation first
    assert names("hf:org/named@test") == names("hf:org/named@eval") == \
        ["data/test-00000-of-00001.jsonl"]
    located = locate_data("hf:org/named")
    assert located.name == "named" and located.root.parent.name == "snapshots"
    assert all(path.is_symlink() for path in located.files)  # named as in the repo, not blobs
    with pytest.raises(ValueError, match=r"^--data hf:org/named: no 'extra' split \(it has "
                                         r"test, train, validation\); name one: "
                                         r"hf:org/named@test$"):
        locate_data("hf:org/named@extra", option="--data")


def test_the_dataset_card_names_configs_and_their_files(hub_cache):
    put_dataset_in_hf_cache(hub_cache, "org/carded", {
        "README.md": CARD,
        "small/part-a-0.parquet": parquet_bytes(pa.table({"text": ["s"]})),
        "small/part-b-0.parquet": parquet_bytes(pa.table({"text": ["not listed"]})),
        "small/holdout.jsonl": jsonl("h"),
        "large/one.jsonl": jsonl("l1"), "large/two.jsonl": jsonl("l2")})
    assert names("hf:org/carded") == ["large/one.jsonl", "large/two.jsonl"]  # default: true
    assert names("hf:org/carded:small") == ["small/part-a-0.parquet"]
    assert names("hf:org/carded:small", splits=EVAL_SPLITS) == ["small/holdout.jsonl"]
    with pytest.raises(ValueError, match=r"^--data_dir hf:org/carded:tiny: no config 'tiny' "
                                         r"\(its dataset card lists small, large\); e\.g\. "
                                         r"hf:org/carded:small$"):
        locate_data("hf:org/carded:tiny")


def test_without_a_card_configs_are_folders_and_a_mix_names_them(hub_cache):
    put_dataset_in_hf_cache(hub_cache, "org/langs", {
        "en/train.jsonl": jsonl("hello"), "en/test.jsonl": jsonl("bye"),
        "fr/train.jsonl": jsonl("bonjour")})
    assert names("hf:org/langs:fr") == ["fr/train.jsonl"]
    assert names(mix_source("hf:org/langs@test", "en")) == ["en/test.jsonl"]
    assert names("hf:org/langs") == ["en/train.jsonl", "fr/train.jsonl"]  # the whole repo
    with pytest.raises(ValueError, match="its folders are en, fr"):
        locate_data("hf:org/langs:de")


def test_a_missing_id_is_one_line_naming_the_option_and_the_fix(hub_cache, tmp_path, capsys,
                                                                tiny_hf_tokenizer_dir):
    argv = ["--data_dir", "hf:nobody/nothing", "--tokenizer_dir", str(tiny_hf_tokenizer_dir),
            "--out_dir", str(tmp_path / "out")]
    assert run_main(pretokenize_pretrain_data.main, argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --data_dir hf:nobody/nothing: no Hugging Face dataset "
                            "'nobody/nothing' in the HF cache (HF_HUB_OFFLINE=1) at ")
    assert error.rstrip().endswith("download it once: hf download --repo-type dataset "
                                   "nobody/nothing") and error.count("\n") == 1
    with pytest.raises(ValueError, match=r"not a Hugging Face dataset id; write "
                                         r"hf:org/name\[:config\]\[@split\]"):
        locate_data("hf:two words")


def test_a_bad_record_of_a_hub_dataset_is_located_by_its_file_and_line(hub_cache):
    snapshot = put_dataset_in_hf_cache(hub_cache, "org/broken", {
        "data/train.jsonl": jsonl("fine") + "{not json\n"})
    with pytest.raises(BadRecordError, match=rf"^{snapshot}/data/train\.jsonl:2: malformed_json"):
        list(iter_texts_from("hf:org/broken"))


def test_a_loading_script_is_never_run(hub_cache, tmp_path, capsys):
    marker = tmp_path / "the_script_ran"
    script = f"open({str(marker)!r}, 'w').close()\n"
    put_dataset_in_hf_cache(hub_cache, "org/scripted", {
        "scripted.py": script, "data/train.jsonl": jsonl("kept")})
    put_dataset_in_hf_cache(hub_cache, "org/only_script", {"only_script.py": script})
    assert names("hf:org/scripted") == ["data/train.jsonl"]
    assert "not running its loading script scripted.py" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"holds a loading script \(only_script\.py\) and no "
                                         "data files; z2all never runs a dataset's code"):
        locate_data("hf:org/only_script")
    assert not marker.exists()


def test_a_folder_split_is_named_with_at(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    for name in ("train.jsonl", "valid.jsonl", "notes.txt"):
        (folder / name).write_text(jsonl(name))
    assert names(str(folder)) == ["notes.txt", "train.jsonl", "valid.jsonl"]  # a folder: all
    assert names(f"{folder}@validation") == names(f"{folder}@valid") == ["valid.jsonl"]
    with pytest.raises(FileNotFoundError, match=r"^--data_dir \S+/nowhere@train: no such file"):
        locate_data(f"{tmp_path / 'nowhere'}@train")


def test_datasets_folders_are_read_as_one_split_wherever_they_are(tmp_path, monkeypatch):
    """save_to_disk folders, and the folder load_dataset caches (its `.map` results beside the
    split shards are not data)."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for split, texts in (("train", ["a", "b"]), ("test", ["c"])):
        (parquet / f"{split}.parquet").write_bytes(parquet_bytes(pa.table({"text": texts})))
    loaded = datasets.load_dataset("parquet", cache_dir=str(tmp_path / "cache"), data_files={
        split: str(parquet / f"{split}.parquet") for split in ("train", "test")})
    loaded["train"].map(lambda record: {"length": len(record["text"])})  # a cache-*.arrow
    [cached] = [path.parent for path in (tmp_path / "cache").rglob("dataset_info.json")]
    assert sorted(path.name for path in cached.glob("*.arrow"))[0].startswith("cache-")
    assert names(str(cached)) == ["parquet-train.arrow"]
    assert names(str(cached), splits=EVAL_SPLITS) == names(f"{cached}@test") == \
        ["parquet-test.arrow"]
    assert locate_data(tmp_path / "cache").files == [cached / "parquet-train.arrow"]
    loaded.save_to_disk(tmp_path / "saved")
    assert names(str(tmp_path / "saved"), splits=EVAL_SPLITS) == \
        ["test/data-00000-of-00001.arrow"]
    with pytest.raises(ValueError, match=r"saved: no 'validation' split \(it has test, train\); "
                                         r"name one: \S+/saved@test"):
        locate_data(f"{tmp_path / 'saved'}@validation")


def _write(folder, names: list[str]) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps({"text": name}) + "\n")


@pytest.mark.parametrize("names, spec, expected", [
    (["train.jsonl", "validation.jsonl"], "{d}@train", "{d}@validation"),
    (["data/train-0.jsonl", "data/test-0.jsonl"], "{d}@train", "{d}@test"),
    (["train.jsonl", "dev.jsonl", "test.jsonl"], "{d}@train", "{d}@validation"),
    (["train.jsonl", "valid.jsonl"], "{d}", None),  # a plain folder: all of it trains
    (["train.jsonl"], "{d}@train", None),
], ids=["validation", "test", "validation-before-test", "plain-folder", "no-such-split"])
def test_the_datas_own_validation_split_is_found_beside_train(names, spec, expected, tmp_path):
    """utils/data_files.validation_spec: the split the trainer evaluates on, or None (it then
    holds out part of train); a DatasetDict and a Hub id: tests/trainer/
    test_train_validation_split.py."""
    folder = tmp_path / "data"
    _write(folder, names)
    found = validation_spec(spec.format(d=folder))
    assert found == (expected.format(d=folder) if expected else None)
