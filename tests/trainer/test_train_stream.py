"""train_my_ddp.py --data_format=stream: exact resume, also 2 ranks x 2 workers after SIGKILL.

Reference: the same command run straight through. Compared: every step's loss (exact float
equality) and the final model.safetensors (byte equality).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor.process_tree import RunProcesses
from tests.train_helpers import (
    TINY_ARGS,
    final_weights,
    records,
    run_main,
    train_losses,
)
from utils.checkpoint import list_checkpoints

REPO = Path(__file__).resolve().parents[2]


def stream_args(data, *extra: str) -> list[str]:
    return [*TINY_ARGS, "--task_type=pretrain", "--data_format=stream",
            f"--data_dir={data['pretrain_raw']}", f"--tokenizer_dir={data['tokenizer']}",
            "--shuffle_buffer=16", "--eval_interval=1000", '--eval_prompts=[]', *extra]


def assert_identical(full: Path, cut: Path, last_step: int) -> None:
    assert train_losses(cut) == train_losses(full)
    assert len(train_losses(full)) == last_step
    assert final_weights(cut, last_step) == final_weights(full, last_step)


def test_stream_resume_is_bitwise_with_workers(data, tmp_path):
    args = stream_args(data, "--num_workers=2", "--max_iters=8", "--save_interval=100")
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert run_main([*args, f"--out_dir={full}"]) == 0
    assert run_main([*args, f"--out_dir={cut}", "--stop_at_iter=3"]) == 0
    assert run_main([*args, f"--out_dir={cut}", "--resume"]) == 0
    assert_identical(full, cut, 8)
    # and the stream is not the pretokenized path under another name: other samples, losses
    pretok = tmp_path / "pretok"
    pretok_args = [a for a in args if not a.startswith(("--data_format", "--data_dir",
                                                        "--shuffle_buffer"))]
    assert run_main([*pretok_args, f"--data_dir={data['pretrain']}", f"--out_dir={pretok}"]) == 0
    assert train_losses(pretok) != train_losses(full)


def test_a_stream_checkpoint_is_not_resumed_as_pretokenized_data(data, tmp_path):
    args = stream_args(data, "--max_iters=4", "--stop_at_iter=2")
    assert run_main([*args, f"--out_dir={tmp_path}"]) == 0
    with pytest.raises(SystemExit, match="written with --data_format=stream"):
        run_main([*TINY_ARGS, "--resume", f"--out_dir={tmp_path}", "--data_format=pretok",
                  f"--data_dir={data['pretrain']}", "--shuffle_buffer=1000"])


def torchrun(args: list[str], out_dir: Path, ranks: int = 2) -> subprocess.Popen:
    """Ranks under torchrun (DataLoader workers need non-daemonic rank processes)."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={ranks}",
         "train_my_ddp.py", *args, f"--out_dir={out_dir}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def finish(process: subprocess.Popen) -> None:
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        kill_all(process)  # nothing left behind, also after a timeout
    assert process.returncode == 0, stderr.decode()[-3000:]


def kill_all(process: subprocess.Popen) -> None:
    """SIGKILL torchrun, its ranks (each in a session of its own) and their workers."""
    tree = RunProcesses(process)
    tree.refresh()
    tree.signal(signal.SIGKILL)
    process.wait(timeout=60)


def heartbeat_step(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "heartbeat").read_text())["step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


def kill9_and_resume(args: list[str], tmp_path: Path, total: int, first_kill: int,
                     ranks: int = 2) -> list[int]:
    """Run `args` under torchrun uninterrupted, and again SIGKILLed (every process) at a random
    step from `first_kill` on, then resumed: both must end identical. Returns the steps that
    survived the kill."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    finish(torchrun(args, full, ranks))
    kill_after = random.Random().randrange(first_kill, total - 1)  # a checkpoint exists by then
    process = torchrun(args, cut, ranks)
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if heartbeat_step(cut) >= kill_after:
            break
        time.sleep(0.01)
    kill_all(process)
    saved = [step for step, _ in list_checkpoints(cut / "ckpt")]
    assert saved and saved[-1] < total, "killed too late to test a resume"
    finish(torchrun([*args, "--resume"], cut, ranks))
    assert_identical(full, cut, total)
    return saved


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds torchrun's ranks via /proc")
def test_two_ranks_two_workers_killed_and_resumed_match_the_uninterrupted_run(data, tmp_path):
    total = 16
    args = stream_args(data, "--num_workers=2", f"--max_iters={total}", "--save_interval=4",
                       "--keep_last=20")
    saved = kill9_and_resume(args, tmp_path, total, first_kill=5)
    assert [r["step"] for r in records(tmp_path / "cut", "resume")] == [saved[-1]]


def test_skipped_bad_records_are_counted_in_metrics(data, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for source in sorted(data["pretrain_raw"].iterdir()):
        (shards / source.name).write_bytes(source.read_bytes())
    for shard in shards.iterdir():  # line 1 of every shard: before any window of either
        lines = shard.read_text().splitlines(keepends=True)
        lines[0] = "{not json\n"
        shard.write_text("".join(lines))
    args = [*stream_args(data, "--max_iters=2", "--save_interval=100"),
            f"--data_dir={shards}", f"--out_dir={tmp_path / 'run'}"]
    with pytest.raises(ValueError, match=r"\.jsonl:1: malformed_json"):
        run_main(args)
    assert run_main([*args, "--skip_bad_records", f"--out_dir={tmp_path / 'skip'}"]) == 0
    assert records(tmp_path / "skip", "train")[-1]["bad_records_skipped"] >= 1
