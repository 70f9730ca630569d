"""A stand-in for train_my_ddp.py that the monitor_process.py tests can crash, hang and resume.

Run as `python -m tests.monitor.fake_trainer --out_dir DIR ...` from the repo root.

It keeps the run-dir contract of the real trainer (docs/design.md §2.7) and nothing else:
- "training" is a hash chain, `state = H(state, step)`, so a skipped, repeated or reordered
  step changes the final state: a resumed run matches an uninterrupted one only if it
  restarted exactly where its checkpoint left off;
- `<out_dir>/heartbeat` (atomic JSON {"step", "time"}) after every step;
- checkpoints `ckpt/step_%06d/` with `state.json` + `manifest.json` (written last), built in a
  temporary dir and renamed; `--resume` loads the newest one whose manifest exists and appends
  `{"kind": "resume", "step", "checkpoint"}` to metrics.jsonl;
- SIGTERM/SIGINT: checkpoint at the end of the current step, write `stop_step`, exit 0;
- failure knobs: `--crash_at_step N` (exit 3 on reaching step N, in every attempt),
  `--crash_after_steps K` (exit 3 after K steps of each attempt), `--fail_at_start CODE`,
  `--spawn_rank` (start a second process in a session of its own, as torchrun starts its
  ranks, that ignores SIGTERM like a rank stuck in a collective; its pid goes to
  `<out_dir>/rank_pid`; only a finished run stops it itself).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from utils.atomic_io import atomic_write_json

STUCK_RANK = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "time.sleep(600)")


def next_state(state: str, step: int) -> str:
    return hashlib.sha256(f"{state}:{step}".encode()).hexdigest()


def save_checkpoint(out_dir: Path, step: int, state: str) -> None:
    final = out_dir / "ckpt" / f"step_{step:06d}"
    if final.exists():
        return
    building = out_dir / "ckpt" / f".tmp_step_{step:06d}_{os.getpid()}"
    atomic_write_json(building / "state.json", {"step": step, "state": state})
    atomic_write_json(building / "manifest.json", {"format": "z2all-checkpoint", "version": 1,
                                                   "step": step, "files": {}})
    os.replace(building, final)


def load_newest_checkpoint(out_dir: Path) -> tuple[int, str, Path] | None:
    done = [path.parent for path in out_dir.glob("ckpt/step_*/manifest.json")]
    if not done:
        return None
    newest = max(done, key=lambda path: int(path.name.removeprefix("step_")))
    saved = json.loads((newest / "state.json").read_text())
    return saved["step"], saved["state"], newest


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--max_iters", type=int, default=40)
    parser.add_argument("--save_interval", type=int, default=5)
    parser.add_argument("--step_time", type=float, default=0.02)
    parser.add_argument("--crash_at_step", type=int, default=None)
    parser.add_argument("--crash_after_steps", type=int, default=None)
    parser.add_argument("--fail_at_start", type=int, default=None)
    parser.add_argument("--spawn_rank", action="store_true")
    args = parser.parse_args()
    if args.fail_at_start is not None:
        return args.fail_at_start

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stop_requested = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stop_requested.append(signum))
    if args.spawn_rank:
        rank = subprocess.Popen([sys.executable, "-c", STUCK_RANK], start_new_session=True)
        (out_dir / "rank_pid").write_text(str(rank.pid))

    step, state = 0, "seed"
    newest = load_newest_checkpoint(out_dir) if args.resume else None
    if newest is not None:
        step, state, path = newest
        with open(out_dir / "metrics.jsonl", "a") as metrics:
            metrics.write(json.dumps({"kind": "resume", "step": step, "checkpoint": str(path)})
                          + "\n")
    steps_this_attempt = 0
    while step < args.max_iters:
        time.sleep(args.step_time)
        step += 1
        steps_this_attempt += 1
        state = next_state(state, step)
        if step == args.crash_at_step or steps_this_attempt == args.crash_after_steps:
            return 3
        atomic_write_json(out_dir / "heartbeat", {"step": step, "time": time.time()})
        if step % args.save_interval == 0 or step == args.max_iters or stop_requested:
            save_checkpoint(out_dir, step, state)
        if stop_requested:
            (out_dir / "stop_step").write_text(str(step))
            return 0
    atomic_write_json(out_dir / "final_state.json", {"step": step, "state": state})
    if args.spawn_rank:
        rank.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
