"""Checkpoints: atomic save, manifest verification, newest-valid resolution, keep-last + best."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from utils.checkpoint import (
    CheckpointError,
    DamagedCheckpointWarning,
    begin_checkpoint,
    best_checkpoint,
    checkpoint_step,
    finish_checkpoint,
    list_checkpoints,
    load_torch,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


def _writer(payload: dict[str, torch.Tensor]):
    def write_files(tmp_dir):
        torch.save(payload, tmp_dir / "trainer_state.pt")
        (tmp_dir / "optim").mkdir()
        torch.save({"shard": payload["w"] * 2}, tmp_dir / "optim" / "rank_0.pt")
    return write_files


def _save(run_dir, step, keep_last=10, val_loss=None):
    payload = {"w": torch.randn(64), "step": torch.tensor(step)}
    path = save_checkpoint(run_dir / "ckpt", step, _writer(payload), keep_last=keep_last,
                           val_loss=val_loss)
    return path, payload


def test_save_verify_and_load_round_trip(tmp_path):
    path, payload = _save(tmp_path, 7)
    assert path.name == "step_000007" and verify_checkpoint(path) is None
    assert checkpoint_step(path) == 7
    loaded = load_torch(path / "trainer_state.pt")
    assert torch.equal(loaded["w"], payload["w"])
    assert not list((tmp_path / "ckpt").glob(".tmp_*"))
    assert resolve_checkpoint(tmp_path) == path
    assert resolve_checkpoint(tmp_path / "ckpt") == path
    assert resolve_checkpoint(path) == path


def _truncate(path):
    target = path / "trainer_state.pt"
    target.write_bytes(target.read_bytes()[:-10])


def _flip_byte(path):
    target = path / "optim" / "rank_0.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))


def _drop_manifest(path):
    os.unlink(path / "manifest.json")


@pytest.mark.parametrize("damage, reason", [(_truncate, "truncated"), (_flip_byte, "sha256"),
                                            (_drop_manifest, "no manifest")])
def test_damaged_newest_is_skipped_with_warning(tmp_path, damage, reason):
    older, _ = _save(tmp_path, 10)
    newest, _ = _save(tmp_path, 20)
    damage(newest)
    assert reason in verify_checkpoint(newest)
    with pytest.warns(DamagedCheckpointWarning, match="step_000020"):
        assert resolve_checkpoint(tmp_path) == older
    with pytest.raises(CheckpointError, match="not usable"):
        resolve_checkpoint(newest)


def test_no_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such"):
        resolve_checkpoint(tmp_path / "missing")
    only, _ = _save(tmp_path, 5)
    _drop_manifest(only)
    with (pytest.warns(DamagedCheckpointWarning),
          pytest.raises(CheckpointError, match="all 1 checkpoints are damaged")):
        resolve_checkpoint(tmp_path)


def test_crash_mid_save_leaves_previous_checkpoint_usable(tmp_path):
    good, _ = _save(tmp_path, 3)
    tmp_dir = begin_checkpoint(tmp_path / "ckpt", 4)
    (tmp_dir / "trainer_state.pt").write_bytes(os.urandom(100))  # ...then the process dies
    assert resolve_checkpoint(tmp_path) == good
    # the next save cleans the leftover temp dir
    newer, _ = _save(tmp_path, 5)
    assert not list((tmp_path / "ckpt").glob(".tmp_*"))
    assert resolve_checkpoint(tmp_path) == newer


def test_keep_last_and_best(tmp_path):
    # step 1 diverged: NaN compares false both ways, so min() would keep it if it counted
    val_losses = {1: float("nan"), 2: 1.5, 3: 2.5, 4: 2.0, 5: 2.2}
    for step, val_loss in val_losses.items():
        _save(tmp_path, step, keep_last=2, val_loss=val_loss)
    best_step = min((step for step, loss in val_losses.items() if math.isfinite(loss)),
                    key=val_losses.get)
    kept = [step for step, _ in list_checkpoints(tmp_path / "ckpt")]
    assert kept == sorted({best_step, 4, 5})
    assert best_checkpoint(tmp_path / "ckpt").name == f"step_{best_step:06d}"


def test_resaving_a_step_replaces_it(tmp_path):
    _save(tmp_path, 9)
    path, payload = _save(tmp_path, 9)
    assert verify_checkpoint(path) is None
    assert torch.equal(load_torch(path / "trainer_state.pt")["w"], payload["w"])


def test_finish_records_every_file(tmp_path):
    tmp_dir = begin_checkpoint(tmp_path, 1)
    _writer({"w": torch.randn(3)})(tmp_dir)
    path = finish_checkpoint(tmp_dir, 1)
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"trainer_state.pt", "optim/rank_0.pt"}
    assert manifest["format"] == "z2all-checkpoint" and manifest["step"] == 1


def test_a_missing_required_file_is_never_sealed(tmp_path):
    """The concurrent-writer repro: one rank's shard is not there when rank 0 seals."""
    tmp_dir = begin_checkpoint(tmp_path, 3)
    _writer({"w": torch.randn(3)})(tmp_dir)
    required = ["trainer_state.pt", "optim/rank_0.pt", "optim/rank_1.pt"]
    with pytest.raises(CheckpointError, match="optim/rank_1.pt missing"):
        finish_checkpoint(tmp_dir, 3, required=required)
    assert list_checkpoints(tmp_path) == []
    torch.save({"shard": torch.ones(1)}, tmp_dir / "optim" / "rank_1.pt")
    path = finish_checkpoint(tmp_dir, 3, required=required)
    assert verify_checkpoint(path) is None
    assert json.loads((path / "manifest.json").read_text())["required"] == sorted(required)


def test_verification_fails_when_a_required_file_is_not_in_the_manifest(tmp_path):
    path, _ = _save(tmp_path, 4)
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["files"]["optim/rank_0.pt"]  # what an incomplete save would have sealed
    (path / "optim" / "rank_0.pt").unlink()
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert "optim/rank_0.pt is required" in verify_checkpoint(path)
    with pytest.raises(CheckpointError, match="not usable"):
        resolve_checkpoint(path)


def test_a_file_named_like_a_checkpoint_does_not_break_the_next_save(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step_000005").write_text("not a checkpoint")
    path, _ = _save(tmp_path, 5)
    assert verify_checkpoint(path) is None and resolve_checkpoint(tmp_path) == path
