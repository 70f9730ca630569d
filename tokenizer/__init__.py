"""Our tokenizers: byte-level BPE (HF tokenizers) and sentencepiece BPE, saved as a standard
`tokenizer.json` that any HF client loads without remote code.

Files, in reading order:
- z2all_tokenizer.py: the saved format, the vocabulary layout (3 special tokens after the base
  vocabulary), and `Z2allTokenizer`, whose encode paths never turn text into special ids;
- byte_level_bpe.py / sentencepiece_bpe.py: how each raw model is trained, and why so (and how
  the sentencepiece model becomes a tokenizer.json with the same ids);
- train_tokenizer.py: the CLI (stream files -> train -> save a directory);
- show_encodings.py: prints sample encodings of saved tokenizers.

`load_tokenizer(dir)` reads a directory's two JSON files; it never imports anything from it.
To use a tokenizer in worker processes, pass them the directory and load it there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .z2all_tokenizer import CONFIG_FILE, TOKENIZER_FILE, Z2allTokenizer


def load_tokenizer(directory: str | os.PathLike) -> Z2allTokenizer:
    """The tokenizer saved in `directory` (by tokenizer.train_tokenizer or model.convert_to_hf)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer dir {directory} does not exist")
    tokenizer_file, config_file = directory / TOKENIZER_FILE, directory / CONFIG_FILE
    for required in (tokenizer_file, config_file):
        if not required.is_file():
            raise FileNotFoundError(f"{required} not found: a tokenizer directory is written by "
                                    "python -m tokenizer.train_tokenizer (format 2)")
    record = json.loads(config_file.read_text(encoding="utf-8")).get("z2all")
    if not isinstance(record, dict):
        raise ValueError(f"{config_file}: no \"z2all\" record; not a z2all tokenizer directory")
    return Z2allTokenizer(tokenizer_file=str(tokenizer_file), name_or_path=str(directory),
                          z2all=record)
