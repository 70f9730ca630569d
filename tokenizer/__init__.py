"""Our tokenizers: byte-level BPE (HF tokenizers) and sentencepiece BPE, saved as a standard
`tokenizer.json` that any HF client loads without remote code.

Files, in reading order:
- text_only.py: the encode paths shared by both classes below (special-token strings in text
  stay text);
- z2all_tokenizer.py: the saved format, the vocabulary layout (3 special tokens after the base
  vocabulary), and `Z2allTokenizer`, whose encode paths never turn text into special ids;
- byte_level_bpe.py / sentencepiece_bpe.py: how each raw model is trained, and why so (and how
  the sentencepiece model becomes a tokenizer.json with the same ids);
- train_tokenizer.py: the CLI (stream files -> train -> save a directory);
- show_encodings.py: prints sample encodings of saved tokenizers;
- pretrained_tokenizer.py: a pretrained model's own tokenizer and chat template (any
  tokenizer.json + tokenizer_config.json without our record).

`load_tokenizer(dir)` reads a directory's two JSON files (and the sentencepiece kind's own model,
when present); it never imports anything from it.
To use a tokenizer in worker processes, pass them the directory and load it there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .pretrained_tokenizer import PretrainedTokenizer, load_pretrained_tokenizer
from .z2all_tokenizer import CONFIG_FILE, SENTENCEPIECE_FILE, TOKENIZER_FILE, Z2allTokenizer


def load_tokenizer(directory: str | os.PathLike) -> Z2allTokenizer | PretrainedTokenizer:
    """The tokenizer saved in `directory`: ours (by tokenizer.train_tokenizer or
    model.convert_to_hf, with a "z2all" record) or a pretrained model's."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer dir {directory} does not exist")
    tokenizer_file, config_file = directory / TOKENIZER_FILE, directory / CONFIG_FILE
    for required in (tokenizer_file, config_file):
        if not required.is_file():
            raise FileNotFoundError(f"{required} not found: a tokenizer directory holds "
                                    f"{TOKENIZER_FILE} and {CONFIG_FILE} (python -m "
                                    "tokenizer.train_tokenizer, or a Hugging Face model dir)")
    record = json.loads(config_file.read_text(encoding="utf-8")).get("z2all")
    if record is None:
        return load_pretrained_tokenizer(directory)
    if not isinstance(record, dict):
        raise ValueError(f"{config_file}: the \"z2all\" record must be an object")
    model_file = directory / SENTENCEPIECE_FILE  # absent from dirs saved by save_pretrained
    return Z2allTokenizer(tokenizer_file=str(tokenizer_file), name_or_path=str(directory),
                          z2all=record, sentencepiece_model=(model_file.read_bytes()
                                                             if model_file.is_file() else None))
