"""Experiment trackers: the scalars of `metrics.jsonl`, mirrored to TensorBoard and/or W&B.

`metrics.jsonl` stays the run's source of truth; a tracker is a second copy meant for eyes.
The trainer's MetricsLogger hands every record it writes to `Trackers.log(kind, step, values)`,
and each numeric field becomes the scalar `<kind>/<field>` at that step:

    {"kind": "train", "step": 20, "loss": 5.91, "lr": 6e-4}  ->  train/loss = 5.91 @ 20
                                                                train/lr   = 6e-4 @ 20

So the curves are the same numbers, at the same step numbers, whatever the kind (train, eval,
DPO rewards, throughput). The run's config goes in once as hyper-parameters. Only rank 0 opens
trackers (`enabled=False` elsewhere gives a `Trackers` that does nothing).

Resuming continues the same curves:
- TensorBoard writes into `<run>/tensorboard` again; the trainer's `resume` record (step N, the
  checkpoint's) reopens the writer with `purge_step=N`, so events a crashed run logged after its
  last checkpoint are hidden instead of drawn twice. Hyper-parameters go in once, on the run's
  first invocation.
- W&B reuses the run id stored in `<run>/wandb_run_id` with `resume="allow"`; every scalar is
  plotted against our own `step` field (`define_metric`), not W&B's internal counter, which
  refuses steps lower than ones it has seen (those a crash lost would come again).

W&B never prompts and never waits on the network unless asked to. An explicit `WANDB_MODE`
wins; otherwise W&B goes online when the user is logged in (`WANDB_API_KEY`, or the key that
`wandb login` saved in ~/.netrc) and offline when not, writing `<run>/wandb/offline-run-*`
(upload it later with `wandb sync <that dir>`). `WANDB_MODE=online` without a key is refused
with the options, before any work, instead of failing inside `wandb.init`. The libraries are
imported only when chosen.
"""

from __future__ import annotations

import json
import netrc
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from utils.option_checks import option

TRACKER_NAMES = ("tensorboard", "wandb", "none")
WANDB_RUN_ID_FILE = "wandb_run_id"


@dataclass
class TrackerOptions:
    """The trainer's `tracking` option group."""

    tracker: str = option("tensorboard", "where curves go besides metrics.jsonl: comma list "
                          "of tensorboard, wandb, none")
    wandb_project: str = option("z2all", "W&B project (offline, under <run>/wandb, when "
                                "not logged in: no WANDB_API_KEY, no `wandb login`)")
    wandb_run_name: str = option("", "W&B run name (default: the run directory's name)")

    def problems(self) -> list[str]:
        try:
            names = parse_tracker_list(self.tracker)
        except ValueError as error:
            return [str(error)]
        if "wandb" in names and wandb_mode() == "online" and not wandb_logged_in():
            return ["--tracker=wandb with WANDB_MODE=online needs a W&B API key: run "
                    "`wandb login` or set WANDB_API_KEY (or WANDB_MODE=offline to log locally)"]
        return []


def parse_tracker_list(spec: str) -> list[str]:
    """`"tensorboard,wandb"` -> ["tensorboard", "wandb"]; `"none"` -> []. Raises a one-line
    ValueError naming the option for an unknown name, before any work is done."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACKER_NAMES]
    if unknown or not names:
        raise ValueError(f"--tracker {spec!r}: expected a comma list of "
                         f"{', '.join(TRACKER_NAMES)}")
    if "none" in names and len(names) > 1:
        raise ValueError(f"--tracker {spec!r}: 'none' cannot be combined with other trackers")
    return [name for name in dict.fromkeys(names) if name != "none"]


def wandb_logged_in() -> bool:
    """Whether W&B has a key to go online with: `WANDB_API_KEY` (or an identity token file),
    or the entry `wandb login` writes to the netrc file ($NETRC, else ~/.netrc) for the host
    of `WANDB_BASE_URL` (api.wandb.ai by default)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        entry = netrc.netrc(os.environ.get("NETRC") or None).authenticators(host or "")
    except (OSError, netrc.NetrcParseError):  # no netrc file, or one wandb could not read either
        return False
    return bool(entry and entry[2])


def wandb_mode() -> str:
    """`WANDB_MODE` if the user chose one, else online when logged in, offline when not (so
    W&B neither prompts for a key nor waits on the network)."""
    chosen = os.environ.get("WANDB_MODE", "").strip().lower()
    if chosen:
        return "online" if chosen == "run" else chosen  # "run" is W&B's old name for online
    return "online" if wandb_logged_in() else "offline"


def scalar_values(values: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a record (bools and texts are not curves)."""
    return {key: value for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def hyperparameters(config: dict[str, Any]) -> dict[str, int | float | str | bool | None]:
    """The config flattened to what both trackers accept: numbers, bools, strings and None
    (an unset option stays None, not the text "null"; TensorBoard drops those)."""
    return {key: value if value is None or isinstance(value, (int, float, str, bool))
            else json.dumps(value) for key, value in config.items()}


class Trackers:
    """The open trackers of one run; `log` and `close` are called by the trainer's logger."""

    def __init__(self, options: TrackerOptions, run_dir: str | Path, config: dict[str, Any],
                 enabled: bool = True) -> None:
        names = parse_tracker_list(options.tracker)
        self._tensorboard = self._wandb = None
        self.tensorboard_dir = Path(run_dir) / "tensorboard"
        if not enabled:
            return
        if "tensorboard" in names:
            first_invocation = not self.tensorboard_dir.exists()
            self._tensorboard = _open_tensorboard(self.tensorboard_dir)
            if first_invocation:
                _write_hyperparameters(self._tensorboard, config)
        if "wandb" in names:
            self._wandb = _open_wandb(options, Path(run_dir), config)

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        """Mirror a metrics.jsonl record; a `resume` record also restarts TensorBoard's curves
        at its step (see the module docstring)."""
        if kind == "resume" and self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = _open_tensorboard(self.tensorboard_dir, purge_step=step)
        scalars = {f"{kind}/{key}": value for key, value in scalar_values(values).items()}
        if not scalars:
            return
        if self._tensorboard is not None:
            for tag, value in scalars.items():
                self._tensorboard.add_scalar(tag, value, step)
        if self._wandb is not None:
            self._wandb.log({**scalars, "step": step})

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()


def _open_tensorboard(log_dir: Path, purge_step: int | None = None) -> Any:
    from torch.utils.tensorboard import SummaryWriter

    # purge_step: readers drop the events at steps >= purge_step written before this point.
    return SummaryWriter(str(log_dir), purge_step=purge_step)


def _write_hyperparameters(writer: Any, config: dict[str, Any]) -> None:
    """The config in TensorBoard's HPARAMS tab, in the same event files as the curves."""
    from torch.utils.tensorboard.summary import hparams

    values = {key: value for key, value in hyperparameters(config).items() if value is not None}
    for summary in hparams(values, metric_dict={}):
        writer.file_writer.add_summary(summary)


def _open_wandb(options: TrackerOptions, run_dir: Path, config: dict[str, Any]) -> Any:
    import wandb

    id_file = run_dir / WANDB_RUN_ID_FILE
    if not id_file.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(uuid.uuid4().hex[:16] + "\n", encoding="utf-8")
    run = wandb.init(project=options.wandb_project, name=options.wandb_run_name or run_dir.name,
                     id=id_file.read_text(encoding="utf-8").strip(), resume="allow",
                     dir=str(run_dir), config=hyperparameters(config),
                     # console="off": the trainer's stdout stays ours (the monitor reads it).
                     mode=wandb_mode(),
                     settings=wandb.Settings(silent=True, console="off"))
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run
