"""Our tokenizers: byte-level BPE (HF tokenizers) and sentencepiece BPE, AutoTokenizer-loadable.

Files, in reading order:
- tokenization_z2all_base.py: what both share: the 3 special tokens after the base vocabulary,
  encode paths that never turn text into special ids, exact decoding, fingerprint;
- tokenization_z2all_bpe.py / tokenization_z2all_sp.py: the two classes, one per library;
- byte_level_bpe.py / sentencepiece_bpe.py: how each raw model is trained, and why so;
- train_tokenizer.py: the CLI (stream files -> train -> save a self-contained dir);
- show_encodings.py: prints sample encodings of saved tokenizers.

A saved directory carries the class's code (transformers' remote code), so it loads anywhere:
`load_tokenizer(dir)`, i.e. `AutoTokenizer.from_pretrained(dir, trust_remote_code=True)`. To use
a tokenizer in worker processes, pass them the directory and load it there.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import HF_MODULES_CACHE


def load_tokenizer(directory: str | os.PathLike) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(directory, trust_remote_code=True)`, one process at a time.

    transformers copies the directory's code into its module cache (~/.cache/huggingface/
    modules) with plain, non-atomic writes; several ranks loading at once could import a
    half-copied file. A file lock in that cache serialises the loads of one machine.
    """
    if not Path(directory).is_dir():  # else HF reads the path as a Hub repo id and says so
        raise FileNotFoundError(f"tokenizer dir {directory} does not exist")
    Path(HF_MODULES_CACHE).mkdir(parents=True, exist_ok=True)
    with open(Path(HF_MODULES_CACHE) / ".z2all_load.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=True)
