"""The data options of a training run, owned by the dataset layer that reads them.

`train_my_ddp.py` shows them as its `data` option group (`--data_dir=...`), and hands this
object, typed, to `dataset.train_data.build_train_data`; nothing else needs to know which of
the two formats is behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dataset.chat_store import other_task_problem
from dataset.stream_shards import parse_data_mix
from utils.data_files import is_data_spec
from utils.option_checks import option

DEFAULT_SHUFFLE_BUFFER = 1000


class DataFormatMismatch(Exception):
    """A checkpoint's data position was written by the other --data_format: it cannot be
    honoured, and retrying an older checkpoint of the same run would not help."""


@dataclass
class DataConfig:
    task_type: Literal["pretrain", "sft", "dpo", "grpo"] = option("pretrain", "what to train")
    data_dir: str = option("data/demo/pretrain_pretok", "pretokenized data (pretrain) or "
                           "raw/pretok sft/dpo data, as dataset.build.build_datasets expects; "
                           "raw data (sft/dpo, stream) may be DIR@split or a Hugging Face "
                           "dataset hf:org/name[:config][@split] (utils/data_files.py)")
    tokenizer_dir: str | None = option(None, "tokenizer dir or Hub id (default: "
                                       "--init_from's own, else tokenizer/demo_hf; recorded "
                                       "absolute)")
    max_seq_len: int = option(256, "tokens per sample")
    pack_samples: bool = option(False, "sft: pack each batch's samples end to end into rows "
                                "of max_seq_len, attention kept within each sample "
                                "(dataset/sft_packing.py)")
    num_workers: int = option(0, "DataLoader worker processes per rank")
    data_format: Literal["pretok", "stream"] = option(
        "pretok", "pretok: .bin/.idx (+ sample index) made offline; stream: raw shards "
        "tokenized on the fly (dataset/stream.py)")
    data_mix: str = option("", "stream: weighted sources, subfolders of data_dir (configs of "
                           "an hf: dataset), e.g. web:0.7,books:0.3 (empty: data_dir is one "
                           "source)")
    shuffle_buffer: int = option(DEFAULT_SHUFFLE_BUFFER,
                                 "stream: samples in each rank's shuffle buffer")
    skip_bad_records: bool = option(False, "stream: skip and count malformed records "
                                    "(metrics.jsonl: bad_records_skipped) instead of stopping")

    def problems(self) -> list[str]:
        """Combinations that cannot work, each a one-line message naming the options."""
        problems = []
        if self.data_format != "stream" and (self.data_mix or self.skip_bad_records):
            problems.append("--data_mix and --skip_bad_records apply to raw shards: add "
                            "--data_format=stream")
        if self.data_mix:
            try:
                parse_data_mix(self.data_mix)
            except ValueError as error:
                problems.append(str(error))
        if self.pack_samples and (self.task_type != "sft" or self.data_format == "stream"):
            problems.append("--pack_samples packs SFT samples from --data_format=pretok: use "
                            "it with --task_type=sft only")
        if self.data_format == "pretok" and self.task_type == "pretrain" and \
                is_data_spec(self.data_dir):
            problems.append(f"--data_dir={self.data_dir} names raw records: pretrain on them "
                            "with --data_format=stream, or pretokenize them first "
                            "(data_preprocess.pretokenize_pretrain_data --out_dir DIR)")
        if self.data_format == "pretok" and (problem := other_task_problem(self.data_dir,
                                                                          self.task_type)):
            problems.append(problem)  # checked here so that a refused run leaves nothing
        return problems
