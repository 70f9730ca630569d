"""A progress bar with the remaining time for a training stage of the demo.

The trainer prints one line per `--log_interval` steps (`[train] step 120  lr ...  loss 2.41`);
the demo runs it as a child process, reads its output line by line and moves a bar to that step,
so the user sees how far the stage is and when it will end (tqdm's ETA: the average time per
step so far times the steps left), with the latest loss beside it. Every other line (evals,
samples, checkpoints) is printed above the bar as it comes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tqdm import tqdm

STEP_LINE = re.compile(r"^\[train\] step (\d+)\s.*?\bloss (\S+)")


def training_steps(argv: list[str]) -> int | None:
    """The steps a training command will run (`--stop_at_iter`, else `--max_iters`), or None
    for a command that trains nothing."""
    options = dict(arg.removeprefix("--").split("=", 1) for arg in argv
                   if arg.startswith("--") and "=" in arg)
    steps = options.get("stop_at_iter") or options.get("max_iters")
    return int(steps) if steps else None


def run_with_progress(argv: list[str], total_steps: int, label: str) -> int:
    """Run `python argv` with a bar of `total_steps` fed by its `[train] step` lines; return
    the last step it reported. Raise CalledProcessError like subprocess.run(check=True) if it
    fails."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines as they are printed, not per 8 KiB
    with subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True,
                          env=env) as child, \
            tqdm(total=total_steps, desc=label, unit="step", dynamic_ncols=True) as bar:
        for line in child.stdout:
            step_line = STEP_LINE.match(line)
            if step_line:
                bar.set_postfix(loss=step_line[2], refresh=False)  # shown by the update
                bar.update(int(step_line[1]) - bar.n)
            else:
                bar.write(line.rstrip("\n"))
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, [sys.executable, *argv])
    return bar.n
