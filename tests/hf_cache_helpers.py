"""A Hugging Face cache built by hand in a test's temporary folder, read offline: datasets as
huggingface_hub stores them (`datasets--org--name/{blobs/<sha256>, snapshots/<commit>/<path> ->
../../blobs/<sha256>, refs/main}`), so a test sees the symlinks a real download leaves."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

COMMIT = "c0ffee" + "0" * 34


def use_offline_hf_cache(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME=home and HF_HUB_OFFLINE=1 for this test (huggingface_hub read its constants at
    import, so they are patched too); returns the hub cache folder."""
    cache = home / "hub"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def put_dataset_in_hf_cache(hub_cache: Path, repo_id: str, files: dict[str, bytes | str],
                            commit: str = COMMIT) -> Path:
    """Dataset `repo_id` at `commit` (refs/main) holding `files` (repository path -> content);
    the snapshot directory."""
    repo = hub_cache / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
