"""ZeRO-1 optimizer checkpoints: one file per rank, loadable with any data-parallel world size.

On disk (`optim/` of a training checkpoint), written by every rank r of a run with W ranks:

    zero1_rank00000_of00002.pt   rank 0's shard      zero1_rank00001_of00002.pt   rank 1's

Each file is a `torch.save`d dict (read back with `weights_only=True`):
    format, version, kind      "z2all-zero1-shard", 1, "DistributedOptimizer"
    world_size, rank           who wrote it
    lr, grad_scaler            identical on all ranks (scaler: None unless fp16)
    param_shapes               {param name: shape} of the whole model, to refuse a wrong model
    pieces                     [{name, start, end, step, main_param, exp_avg, exp_avg_sq}]
                               fp32 values of elements [start, end) of the flattened param

Because a piece is addressed by (parameter name, element range) and not by bucket or rank,
loading is a pure interval copy: for each piece the loading rank needs, copy the overlapping
part of every saved piece of the same parameter. Worked example: param `w` has 6 elements; it
was saved by W=2 ranks as w[0:4] (rank 0's file) and w[4:6] (rank 1's file). A run with W=4
whose rank 1 needs w[3:5] copies saved w[3:4] from rank 0's file (its local [3:4]) and w[4:5]
from rank 1's file (local [0:1]). Every element must be covered exactly once, or loading fails.
Files are read one at a time, so memory stays at one rank file plus this rank's shard.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from optimizer.optimizer import STATE_VERSION, check_state_header

SHARD_FORMAT = "z2all-zero1-shard"
TENSOR_KEYS = ("main_param", "exp_avg", "exp_avg_sq")
_FILE_NAME = re.compile(r"zero1_rank(\d{5})_of(\d{5})\.pt")


def shard_file_name(rank: int, world_size: int) -> str:
    return f"zero1_rank{rank:05d}_of{world_size:05d}.pt"


def find_shard_files(optim_dir: Path) -> list[Path]:
    """All rank files of one save, in rank order; refuses an incomplete or mixed set."""
    found = sorted((int(m[2]), int(m[1]), path) for path in optim_dir.glob("zero1_rank*.pt")
                   if (m := _FILE_NAME.fullmatch(path.name)))
    if not found:
        raise FileNotFoundError(f"{optim_dir}: no ZeRO-1 shard files (zero1_rank*_of*.pt); "
                                "a non-ZeRO checkpoint (optimizer.pt) loads with "
                                "use_distributed_optimizer off")
    world_sizes = {world_size for world_size, _, _ in found}
    ranks = [rank for _, rank, _ in found]
    if len(world_sizes) != 1 or ranks != list(range(next(iter(world_sizes)))):
        raise ValueError(f"{optim_dir}: incomplete or mixed ZeRO-1 shard files: "
                         f"{[path.name for _, _, path in found]}")
    return [path for _, _, path in found]


def load_resharded_state(optim_dir: Path, my_pieces: list[tuple[str, int, int]],
                         param_shapes: dict[str, list[int]], rank: int,
                         world_size: int) -> dict[str, Any]:
    """A shard state dict for (rank, world_size) whose pieces are `my_pieces` (name, start,
    end), assembled from the files of a save made with any world size (module docstring)."""
    by_name: dict[str, list[int]] = {}
    for index, (name, _, _) in enumerate(my_pieces):
        by_name.setdefault(name, []).append(index)
    values = [{key: torch.empty(end - start) for key in TENSOR_KEYS}
              for _, start, end in my_pieces]
    coverage = [torch.zeros(end - start, dtype=torch.int32) for _, start, end in my_pieces]
    steps: set[int] = set()
    header: dict[str, Any] = {}
    for path in find_shard_files(optim_dir):
        saved = torch.load(path, map_location="cpu", weights_only=True)
        check_state_header(saved, SHARD_FORMAT, saved.get("kind", "?"))
        if saved["param_shapes"] != param_shapes:
            differ = _differing_params(saved["param_shapes"], param_shapes)
            raise ValueError(f"{path}: saved for a different model; parameters differ: {differ}")
        header = header or saved
        for piece in saved["pieces"]:
            steps.add(piece["step"])
            for index in by_name.get(piece["name"], []):
                _, start, end = my_pieces[index]
                low, high = max(start, piece["start"]), min(end, piece["end"])
                if low >= high:
                    continue
                for key in TENSOR_KEYS:
                    values[index][key][low - start:high - start] = \
                        piece[key][low - piece["start"]:high - piece["start"]]
                coverage[index][low - start:high - start] += 1
    for (name, start, end), covered in zip(my_pieces, coverage):
        if not bool((covered == 1).all()):
            raise ValueError(f"{optim_dir}: elements [{start}, {end}) of {name} are not covered "
                             "exactly once by the saved shards (corrupt or mixed checkpoint)")
    if len(steps) > 1:
        raise ValueError(f"{optim_dir}: shards disagree on the Adam step count: {sorted(steps)}")
    step = steps.pop() if steps else 0
    return {"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": header["kind"],
            "world_size": world_size, "rank": rank, "lr": header["lr"],
            "grad_scaler": header["grad_scaler"], "param_shapes": param_shapes,
            "pieces": [{"name": name, "start": start, "end": end, "step": step, **value}
                       for (name, start, end), value in zip(my_pieces, values)]}


def _differing_params(saved: dict[str, list[int]], current: dict[str, list[int]]) -> list[str]:
    return sorted(name for name in set(saved) | set(current)
                  if saved.get(name) != current.get(name))
