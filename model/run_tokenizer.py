"""A model owns its tokenizer: where it is, and the check that a given tokenizer is that one.

A model's token ids mean nothing with another tokenizer (same size or not: the loss starts at
ln(vocab) and generation prints garbage), so every tool finds the model's own by default:

    what --ckpt is                     its tokenizer
    an HF model dir                    the directory itself (tokenizer.json, its template, ...)
    a run dir or one of its            <run>/tokenizer/, the copy the trainer keeps
    checkpoints                        (`save_run_tokenizer`); for older runs the tokenizer_dir
                                       in <run>/config.json (absolute, or relative to the
                                       working directory or to the run's grandparent, where
                                       `out/<run>` runs were started)
    a bare save_pretrained dir         a tokenizer saved next to the weights

An explicit `--tokenizer_dir` is checked by `check_tokenizer_matches`: its vocabulary must fit
the embedding, and its fingerprint (the hash of what decides ids, tokenizer/z2all_tokenizer.py)
must be the one the model records (`Z2allConfig.tokenizer_fingerprint`) or, where none is
recorded, that of the model's own tokenizer above. A mismatch is refused in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from model.configuration_z2all import Z2allConfig
from tokenizer import load_tokenizer
from utils.run_directory import RUN_MARKER
from utils.run_ownership import RUN_TOKENIZER_DIR, foreign_entry
from utils.tokenizer_protocol import Tokenizer

RUN_CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def save_run_tokenizer(tokenizer: Tokenizer, run_dir: str | os.PathLike) -> Path:
    """Keep a copy of the run's tokenizer in `<run_dir>/tokenizer/` (written to a temporary
    directory, then renamed into place: a crash leaves the old copy or the new one). An earlier
    copy is replaced only in a directory marked as a z2all run and only when it holds nothing
    but a tokenizer's files (utils/run_ownership.py): anything else there (code, a user's
    notes) is not the run's to delete. A copy of the same tokenizer (a resumed run) is left as
    it is: the other ranks read it while rank 0 saves."""
    run_dir = Path(run_dir)
    target = run_dir / RUN_TOKENIZER_DIR
    if target.exists() and not (run_dir / RUN_MARKER).is_file():
        raise ValueError(f"{target} exists but {run_dir} is not a z2all run (no {RUN_MARKER}): "
                         "not replacing what the run did not write")
    if target.exists() and (foreign := foreign_entry(run_dir, names=(RUN_TOKENIZER_DIR,))):
        raise ValueError(f"{run_dir / foreign} is not a tokenizer file a run writes: not "
                         f"replacing {target}; move it away or choose another run directory")
    if target.exists() and _fingerprint_at(target) == tokenizer.fingerprint:
        return target
    run_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=run_dir))
    tokenizer.save_pretrained(staging)
    if target.exists():  # moved aside whole, then removed: never a half-deleted tokenizer/
        replaced = Path(tempfile.mkdtemp(prefix=".tokenizer.old.", dir=run_dir))
        target.rename(replaced / RUN_TOKENIZER_DIR)
        staging.rename(target)
        shutil.rmtree(replaced)
    else:
        staging.rename(target)
    return target


def _fingerprint_at(tokenizer_dir: Path) -> str | None:
    """The fingerprint of the tokenizer saved in `tokenizer_dir`; None if it cannot be read."""
    try:
        return load_tokenizer(tokenizer_dir).fingerprint
    except (OSError, ValueError):
        return None


def _recorded_tokenizer_dir(run_dir: Path) -> Path | None:
    """The tokenizer_dir in an older run's config.json, resolved (see the module docstring)."""
    run_config = run_dir / RUN_CONFIG_FILE
    if not run_config.is_file():
        return None
    recorded = json.loads(run_config.read_text(encoding="utf-8")).get("tokenizer_dir")
    if not recorded:
        return None
    for candidate in (Path(recorded), Path.cwd() / recorded,
                      run_dir.resolve().parent.parent / recorded):
        if (candidate / TOKENIZER_CONFIG_FILE).is_file():
            return candidate.absolute()
    return None


def default_tokenizer_dir(ckpt: str | os.PathLike, model_dir: Path) -> Path | None:
    """The model's own tokenizer directory (the module docstring's table), or None."""
    ckpt = Path(ckpt)
    if (model_dir / TOKENIZER_CONFIG_FILE).is_file():  # an HF dir or an export
        return model_dir
    run_dirs = (ckpt, model_dir.parent.parent)  # given the run dir, or <run>/ckpt/step_N
    for run_dir in run_dirs:
        if (run_dir / RUN_TOKENIZER_DIR / TOKENIZER_CONFIG_FILE).is_file():
            return run_dir / RUN_TOKENIZER_DIR
    for run_dir in run_dirs:
        if (recorded := _recorded_tokenizer_dir(run_dir)) is not None:
            return recorded
    return None


def check_tokenizer_matches(config: Z2allConfig, tokenizer: Tokenizer, model_source: str,
                            expected_fingerprint: str | None = None) -> None:
    """Refuse (ValueError, one line) a tokenizer that is not the model's: more ids than
    embedding rows, or a fingerprint other than the recorded (else `expected_fingerprint`)."""
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"tokenizer {tokenizer.name_or_path} has {len(tokenizer)} tokens but "
                         f"{model_source} embeds only {config.vocab_size}: not its tokenizer")
    expected = config.tokenizer_fingerprint or expected_fingerprint
    if expected is not None and tokenizer.fingerprint != expected:
        raise ValueError(f"tokenizer {tokenizer.name_or_path} (fingerprint "
                         f"{tokenizer.fingerprint}) is not the one {model_source} was trained "
                         f"with (fingerprint {expected}); leave --tokenizer_dir out to use "
                         "the model's own")


def model_tokenizer(ckpt: str | os.PathLike, config: Z2allConfig, model_dir: Path,
                    tokenizer_dir: str | os.PathLike | None = None) -> Any:
    """The tokenizer to run the model with: `tokenizer_dir` after `check_tokenizer_matches`,
    or by default the model's own (refused in one line when there is none)."""
    own_dir = default_tokenizer_dir(ckpt, model_dir)
    if tokenizer_dir is None:
        if own_dir is None:
            raise ValueError(f"no tokenizer found for {ckpt} (no {RUN_TOKENIZER_DIR}/ in the "
                             "run, none recorded, none next to the weights); pass "
                             "--tokenizer_dir")
        tokenizer = load_tokenizer(own_dir)
        check_tokenizer_matches(config, tokenizer, str(ckpt))
        return tokenizer
    tokenizer = load_tokenizer(tokenizer_dir)
    expected = None if own_dir is None else load_tokenizer(own_dir).fingerprint
    check_tokenizer_matches(config, tokenizer, str(ckpt), expected)
    return tokenizer
