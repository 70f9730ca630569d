"""`python -m tokenizer.train_tokenizer`: train a z2all tokenizer on raw text, save it as a dir.

    python -m tokenizer.train_tokenizer --type hf --input data/demo/pretrain \\
        --vocab_size 8192 --out tokenizer/demo_hf

1. Stream the documents of every .jsonl/.json/.parquet/.txt/.arrow file --input names (folders,
   `DIR@split`, Hub datasets `hf:org/name`: utils/data_files.py), never holding the corpus in
   memory;
2. train the raw library model (byte-level BPE or sentencepiece BPE) with V-3 base pieces, as a
   `tokenizers` model (sentencepiece's is converted; its own model file is kept beside it, and
   `encode_batch` runs it: tokenizer/z2all_tokenizer.py);
3. add the 3 special tokens at ids V-3, V-2, V-1 (tokenizer/z2all_tokenizer.py);
4. save tokenizer.json + tokenizer_config.json into a temporary dir next to --out, load that
   back and check it gives the same ids (and, for sentencepiece, the library's ids), then rename
   it to --out: a crash never leaves a half-written tokenizer under --out.

Since step 4 replaces --out, --out is checked first (`check_out_dir`): it may be new, empty or
an earlier z2all tokenizer dir (only the files step 4 writes), and never the corpus, a
directory holding it, a place inside it, or inside a z2all run (its tokenizer copy). Anything
else is refused instead of deleted. A symlink --out is followed: its target is replaced.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece
from tokenizers import Tokenizer
from tqdm import tqdm

from utils.atomic_io import fsync_dir
from utils.boolean_flags import add_boolean_flag
from utils.cli_errors import run_main
from utils.data_files import iter_texts_from
from utils.data_output_dir import check_apart, first_foreign_entry
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser
from utils.readers import ReadStats
from utils.run_directory import read_json_or_none

from . import load_tokenizer
from .byte_level_bpe import train_byte_level_bpe
from .sentencepiece_bpe import sentencepiece_to_tokenizers, train_sentencepiece_bpe
from .z2all_tokenizer import (
    CONFIG_FILE,
    FORMAT_NAME,
    SENTENCEPIECE_FILE,
    SPECIAL_TOKENS,
    TOKENIZER_FILE,
    Z2allTokenizer,
    with_special_tokens,
)

KINDS = {"hf": "byte_level_bpe", "sp": "sentencepiece_bpe"}
# Checked after saving: the reloaded tokenizer must encode this exactly like the trained one.
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   SENTENCEPIECE_FILE}
"""What a tokenizer dir written by this tool may hold; --out may replace such a dir only."""
PROBE_TEXT = "Hello, world! 你好，世界。 def f(x):\n\treturn x ** 2  # 12345 🙂 <|im_end|>"


@dataclass
class TrainTokenizerConfig:
    type: str = field(metadata={"help": "hf: byte-level BPE (HF tokenizers); sp: sentencepiece BPE",
                                "choices": ["hf", "sp"]})
    input: list[str] = field(metadata={
        "help": "files or directories of .jsonl/.json/.parquet/.txt, DIR@split, or "
                "hf:org/name[:config][@split]"})
    vocab_size: int = field(metadata={"help": "total vocabulary V, the 3 special tokens included"})
    out: str = field(metadata={"help": "output directory (tokenizer.json + tokenizer_config.json)"})
    text_key: list[str] = field(default_factory=lambda: ["text"], metadata={
        "help": "record field(s) holding the text, tried in order"})
    max_documents: int | None = field(default=None,
                                      metadata={"help": "read at most this many records"})
    seed: int = field(default=0, metadata={
        "help": "sentencepiece's sentence sampling (byte-level BPE training is deterministic)"})
    skip_bad_records: bool = field(default=False, metadata={
        "help": "skip malformed records (counted and reported) instead of stopping"})
    sp_max_sentences: int = field(default=2_000_000, metadata={
        "help": "sp only: sentences kept in RAM for training (a uniform sample of the stream)"})


def parse_args(argv: list[str] | None = None) -> TrainTokenizerConfig:
    """Command-line flags generated from TrainTokenizerConfig: the dataclass is the doc."""
    parser = OptionParser(description=__doc__.split("\n")[0])
    for option in dataclasses.fields(TrainTokenizerConfig):
        if option.type == "bool":  # --flag, --flag true|false, --no_flag
            add_boolean_flag(parser, f"--{option.name}", help=option.metadata["help"],
                             default=option.default)
            continue
        kwargs = {"help": option.metadata["help"], "dest": option.name,
                  "nargs": "+" if option.type == "list[str]" else None,
                  "type": int if "int" in option.type else str,
                  "choices": option.metadata.get("choices")}
        if option.default is not dataclasses.MISSING:
            kwargs["default"] = option.default
        elif option.default_factory is not dataclasses.MISSING:
            kwargs["default"] = option.default_factory()
        else:
            kwargs["required"] = True
        parser.add_argument(f"--{option.name}", **kwargs)
    config = TrainTokenizerConfig(**vars(parser.parse_args(argv)))
    # Byte-level BPE starts from the 256 byte tokens; sentencepiece needs one piece at least.
    min_vocab = (256 if config.type == "hf" else 1) + len(SPECIAL_TOKENS)
    raise_problems([range_problem("--vocab_size", config.vocab_size, min_vocab),
                    range_problem("--max_documents", config.max_documents, 1),
                    range_problem("--sp_max_sentences", config.sp_max_sentences, 1)])
    check_out_dir(config.out, config.input)
    return config


def check_out_dir(out: str, inputs: list[str]) -> None:
    """Refuse an --out whose replacement would delete something train_tokenizer did not write:
    an input, a folder holding one or inside one, a run's tokenizer copy (anything inside a
    z2all run, utils/data_output_dir.py), or a folder that is not a z2all tokenizer dir (only
    TOKENIZER_FILES, and a tokenizer_config.json with z2all's record). A symlink is followed:
    what it points to is checked, and replaced, the link itself kept."""
    check_apart(out, [("--input", path) for path in inputs], option="--out")
    target = Path(out).resolve()
    if target.exists() and not target.is_dir():
        raise ValueError(f"--out {out} is a file; choose a directory path")
    if not target.is_dir() or not any(target.iterdir()):
        return
    foreign = first_foreign_entry(target, dict.fromkeys(TOKENIZER_FILES, "train_tokenizer"))
    if foreign is not None:
        raise ValueError(f"--out {out} holds {foreign}, which train_tokenizer did not write (it "
                         "replaces only an earlier z2all tokenizer dir): choose a new or empty "
                         "--out")
    if not is_z2all_tokenizer_dir(target):
        raise ValueError(f"--out {out} is not a z2all tokenizer dir (no {TOKENIZER_FILE}, or a "
                         f"{CONFIG_FILE} without z2all's record) and would be replaced: choose "
                         "a new or empty --out")


def is_z2all_tokenizer_dir(directory: Path) -> bool:
    """Whether `directory` holds tokenizer.json and a tokenizer_config.json that z2all wrote."""
    config = read_json_or_none(directory / CONFIG_FILE)
    record = config.get("z2all") if config is not None else None
    return ((directory / TOKENIZER_FILE).is_file() and isinstance(record, dict)
            and record.get("format") == FORMAT_NAME)


def train_raw_model(kind: str, texts: Iterable[str], base_vocab_size: int, seed: int = 0,
                    sp_max_sentences: int = 2_000_000, show_progress: bool = True
                    ) -> tuple[Tokenizer, bytes | None]:
    """Train on the stream `texts`: (the model as a `tokenizers.Tokenizer`, and for sentencepiece
    the library's own serialized model, else None)."""
    if kind == "hf":
        tokenizer = train_byte_level_bpe(texts, base_vocab_size, show_progress=show_progress)
        learned = tokenizer.get_vocab_size()
        if learned != base_vocab_size:  # the BPE trainer stops early when it runs out of pairs
            raise ValueError(f"the corpus is too small for --vocab_size: only {learned} of "
                             f"{base_vocab_size} base pieces could be learned")
        return tokenizer, None
    model_bytes = train_sentencepiece_bpe(texts, base_vocab_size, seed=seed,
                                          max_sentences=sp_max_sentences,
                                          show_progress=show_progress)
    return sentencepiece_to_tokenizers(model_bytes), model_bytes


def build_tokenizer(kind: str, texts: Iterable[str], vocab_size: int, out: str | os.PathLike,
                    training: dict | None = None, seed: int = 0,
                    sp_max_sentences: int = 2_000_000, show_progress: bool = True
                    ) -> Z2allTokenizer:
    """Train on `texts` and save a tokenizer dir at `out` (steps 2-4 above)."""
    base_vocab_size = vocab_size - len(SPECIAL_TOKENS)
    raw, sentencepiece_model = train_raw_model(kind, texts, base_vocab_size, seed,
                                               sp_max_sentences, show_progress)
    tokenizer = Z2allTokenizer(tokenizer_object=with_special_tokens(raw),
                               z2all={"kind": KINDS[kind], "training": training},
                               sentencepiece_model=sentencepiece_model)
    out = Path(out).resolve()  # through a symlink: its target is replaced, the link kept
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the tokenizer dir is meant to be shared
    try:
        tokenizer.save_pretrained(staging)
        if sentencepiece_model is not None:
            (staging / SENTENCEPIECE_FILE).write_bytes(sentencepiece_model)
        check_reloads_identically(staging, tokenizer, sentencepiece_model)
        _fsync_files(staging)
        _replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return tokenizer


def check_reloads_identically(directory: Path, tokenizer: Z2allTokenizer,
                              sentencepiece_model: bytes | None) -> None:
    """Load `directory` as our tools will and compare it with the tokenizer in memory (and with
    sentencepiece itself, whose model the saved tokenizer.json was converted from)."""
    reloaded = load_tokenizer(directory)
    same = (len(reloaded) == len(tokenizer)
            and reloaded.encode(PROBE_TEXT) == tokenizer.encode(PROBE_TEXT)
            and reloaded.fingerprint == tokenizer.fingerprint)
    if sentencepiece_model is not None:
        library = sentencepiece.SentencePieceProcessor(model_proto=sentencepiece_model)
        same = same and reloaded.encode(PROBE_TEXT) == library.encode(PROBE_TEXT)
    if not same:
        raise RuntimeError(f"{directory}: the saved tokenizer does not reload identically")


def _fsync_files(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(directory)


def _replace_dir(staging: Path, out: Path) -> None:
    """Move the finished `staging` dir to `out`, replacing an older `out` if there is one."""
    if out.exists():
        retired = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, retired)
        os.replace(staging, out)
        shutil.rmtree(retired)
    else:
        os.replace(staging, out)
    fsync_dir(out.parent)


def stream_documents(config: TrainTokenizerConfig, stats: ReadStats) -> Iterator[str]:
    """The non-empty texts of the first --max_documents records, read lazily with a progress bar."""
    texts = iter_texts_from(config.input, config.text_key,
                            skip_bad_records=config.skip_bad_records, stats=stats)
    for text in tqdm(itertools.islice(texts, config.max_documents), desc="reading documents",
                     unit=" docs", mininterval=2.0):
        if text:
            yield text


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    started = time.perf_counter()
    stats = ReadStats()
    training = dataclasses.asdict(config)
    texts = stream_documents(config, stats)
    first = next(texts, None)  # an empty corpus is refused here, not as "too small" later
    if first is None:
        raise ValueError(f"no text found in {' '.join(config.input)} (looked for the "
                         f"{' / '.join(config.text_key)} field of each record)")
    tokenizer = build_tokenizer(config.type, itertools.chain([first], texts), config.vocab_size,
                                config.out, training=training, seed=config.seed,
                                sp_max_sentences=config.sp_max_sentences)
    skipped = sum(stats.skipped.values())
    if skipped:
        print(f"skipped {skipped} bad records: {dict(stats.skipped)}")
    print(f"trained {tokenizer.kind} tokenizer in {time.perf_counter() - started:.1f} s on "
          f"{stats.records_read} records: V={len(tokenizer)} (specials "
          f"{tokenizer.special_token_ids}), fingerprint {tokenizer.fingerprint} -> {config.out}")


if __name__ == "__main__":
    sys.exit(run_main(main))
