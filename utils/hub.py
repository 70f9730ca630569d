"""Models, tokenizers and datasets named by Hugging Face Hub id: the one place an id becomes a
local directory.

    --init_from meta-llama/Llama-3.2-1B [--revision main]   ->  $HF_HOME/hub/models--meta-llama--
                                                               Llama-3.2-1B/snapshots/<commit>/
    --data_dir hf:roneneldan/TinyStories                     ->  $HF_HOME/hub/datasets--roneneldan--
                                                               TinyStories/snapshots/<commit>/

The id goes through `huggingface_hub.snapshot_download`, which reads the local HF cache (where
transformers, datasets, TRL and litgpt users already have their models and data) and, unless
`HF_HUB_OFFLINE=1`, fetches what is missing. It fetches only files that are data: for a model
JSON (config, tokenizer), `tokenizer.model` and safetensors weights, never pickled `.bin`
weights or code (the loaders read nothing else either: no remote code, safetensors only); for a
dataset the files a caller names by pattern (utils/hub_datasets.py: data files and the dataset
card, never a `.py` loading script).

A local directory always wins over a model id of the same spelling. The snapshot directory's
name is the commit it holds, so the resolved path records which snapshot a run used
(`snapshot_of`), and a resumed run can refuse another one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SAFE_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[^/]+)/?$")


def is_offline() -> bool:
    """HF_HUB_OFFLINE=1 (as huggingface_hub spells truth): the cache alone, no network."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def local_dir(spec: str, option: str, revision: str | None = None,
              cache_only: bool = False) -> str:
    """`spec` itself when it exists on disk or is no Hub id; else the Hub snapshot it names
    (one-line ValueError naming `option` when neither is there). `cache_only`: never
    download, as with HF_HUB_OFFLINE=1 (a planner that reads only config.json)."""
    if Path(spec).exists() or not _HUB_ID.match(spec):
        return spec
    at = f"@{revision}" if revision else ""
    return _snapshot(spec, "model", SAFE_PATTERNS, option, spec + at, revision, cache_only)


def dataset_snapshot(repo_id: str, patterns: list[str], option: str, given: str) -> Path:
    """The snapshot directory of dataset `repo_id` holding (at least) the files matching
    `patterns`; `given` is the user's spelling, for the one-line error."""
    return Path(_snapshot(repo_id, "dataset", patterns, option, given))


def _snapshot(repo_id: str, repo_type: str, patterns: list[str], option: str, given: str,
              revision: str | None = None, cache_only: bool = False) -> str:
    """snapshot_download of `patterns`; a one-line ValueError naming `option` if it fails."""
    from huggingface_hub import constants, errors, snapshot_download  # only for an id

    try:
        return snapshot_download(repo_id, repo_type=repo_type, revision=revision,
                                 allow_patterns=patterns,
                                 local_files_only=cache_only or is_offline())
    except (errors.HfHubHTTPError, errors.HFValidationError, OSError) as error:
        where = "the HF cache" + (" (HF_HUB_OFFLINE=1)" if is_offline()
                                  else " (nothing is downloaded here)" if cache_only
                                  else " or the Hub")
        at = f"@{revision}" if revision else ""
        missing = ("no such directory, and no Hugging Face model" if repo_type == "model"
                   else "no Hugging Face dataset")
        download = "hf download" + (" --repo-type dataset" if repo_type == "dataset" else "")
        raise ValueError(
            f"{option} {given}: {missing} {repo_id!r}{at} in {where} at {constants.HF_HUB_CACHE} "
            f"({type(error).__name__}); give a directory, or download it once: "
            f"{download} {repo_id}") from None


def snapshot_of(path: str | os.PathLike | None) -> dict[str, str] | None:
    """{"id": "org/name", "snapshot": commit} when `path` is a Hub cache snapshot, else None."""
    found = _SNAPSHOT.search(str(path)) if path is not None else None
    if found is None:
        return None
    return {"id": f"{found['org']}/{found['name']}", "snapshot": found["commit"]}
