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

A ZeRO-0 run's `optimizer.pt` (optimizer.py) is read the same way, as the one file of a
one-rank save with a whole piece per trainable parameter: it lists the Adam state by position
in its optimizer's param groups, and `replicated_order` names the positions as that optimizer
built them (trainable params in the module's order, matrices first: adamw.py
`weight_decay_groups`); its fp32 main params (bf16/fp16 runs) are listed in the module's
order. Worked example: a module with `inp.weight` [16, 8], `inp.bias` [16], `gain` [16],
`out.weight` [4, 16] saved exp_avg = [m0, m1, m2, m3], which are inp.weight, out.weight,
inp.bias, gain, and main_params = [w0, w1, w2, w3], which are inp.weight, inp.bias, gain,
out.weight. With LoRA only the adapters are trainable, so only they are listed. An fp32
ZeRO-0 run saves no main params (its weights are them, and the resumed model holds them,
loaded from the same checkpoint): its pieces carry `main_param` None, and the loading
optimizer keeps its main params as built from those weights.

The overlapped optimizer's `overlapped_adamw.pt` (`--comm_hook=overlap_optim`) is read the
same way: it stores the parameter names of every bucket, and each bucket's AdamW holds its
state in `grouped_order` of those names (matrices first); its fp32 master copies (bf16 runs)
follow the buckets' name order.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch

from optimizer.adamw import weight_decay_groups
from optimizer.state_header import (
    OVERLAPPED_CHECKPOINT_FILE,
    OVERLAPPED_FORMAT,
    OVERLAPPED_VERSION,
    REPLICATED_CHECKPOINT_FILE,
    REPLICATED_STATE_VERSION,
    STATE_FORMAT,
    STATE_VERSION,
    check_state_header,
)

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
        raise FileNotFoundError(f"{optim_dir}: no optimizer state (zero1_rank*_of*.pt, "
                                f"{REPLICATED_CHECKPOINT_FILE} or {OVERLAPPED_CHECKPOINT_FILE})")
    world_sizes = {world_size for world_size, _, _ in found}
    ranks = [rank for _, rank, _ in found]
    if len(world_sizes) != 1 or ranks != list(range(next(iter(world_sizes)))):
        raise ValueError(f"{optim_dir}: incomplete or mixed ZeRO-1 shard files: "
                         f"{[path.name for _, _, path in found]}")
    return [path for _, _, path in found]


def replicated_order(param_shapes: dict[str, list[int]], trainable: Collection[str]
                     ) -> list[str]:
    """The names of the tensors a ZeRO-0 optimizer updates, in its param-group order (module
    docstring): `param_shapes` in the module's parameter order, `trainable` those with state."""
    return grouped_order([name for name in param_shapes if name in trainable], param_shapes)


def grouped_order(names: list[str], param_shapes: dict[str, list[int]]) -> list[str]:
    """`names` in the order an AdamW built over their tensors (in that order) holds them: the
    groups are formed by the optimizers' own rule (`weight_decay_groups`), on shape-only
    stand-ins."""
    stand_ins = [(torch.empty(param_shapes[name], device="meta"), name) for name in names]
    return [name for group in weight_decay_groups(stand_ins, 0.0) for name in group["params"]]


def _whole_piece(name: str, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: int,
                 main_param: torch.Tensor | None) -> dict[str, Any]:
    """One parameter's whole state as a piece [0, numel) of a one-rank save."""
    return {"name": name, "start": 0, "end": exp_avg.numel(), "step": step,
            "main_param": None if main_param is None else main_param.flatten(),
            "exp_avg": exp_avg.flatten(), "exp_avg_sq": exp_avg_sq.flatten()}


def _replicated_as_pieces(path: Path, param_shapes: dict[str, list[int]],
                          trainable: Collection[str]) -> dict[str, Any]:
    """A ZeRO-0 `optimizer.pt` as the one file of a one-rank save (module docstring)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    check_state_header(state, STATE_FORMAT, state.get("kind", "?"), REPLICATED_STATE_VERSION)
    names, adam = replicated_order(param_shapes, trainable), state["adam"]
    saved_shapes = [list(exp_avg.shape) for exp_avg in adam["exp_avg"]]
    if saved_shapes != [param_shapes[name] for name in names]:
        raise ValueError(f"{path}: saved for a different model or other trainable parameters: "
                         f"{len(saved_shapes)} tensors, this model trains {len(names)}")
    in_module_order = [name for name in param_shapes if name in trainable]
    main_params = (dict(zip(in_module_order, state["main_params"], strict=True))
                   if state["main_params"] else {})
    return {"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": state["kind"],
            "world_size": 1, "rank": 0, "lr": adam["lr"], "grad_scaler": state["grad_scaler"],
            "param_shapes": param_shapes,
            "pieces": [_whole_piece(name, exp_avg, exp_avg_sq, step, main_params.get(name))
                       for name, exp_avg, exp_avg_sq, step in zip(
                           names, adam["exp_avg"], adam["exp_avg_sq"], adam["step"])]}


def _overlapped_as_pieces(path: Path, param_shapes: dict[str, list[int]]) -> dict[str, Any]:
    """The overlapped optimizer's file as the one file of a one-rank save (module docstring)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if (state.get("format"), state.get("version")) != (OVERLAPPED_FORMAT, OVERLAPPED_VERSION):
        raise ValueError(f"{path}: not a {OVERLAPPED_FORMAT} v{OVERLAPPED_VERSION} state")
    in_buckets = [name for bucket in state["layout"] for name in bucket]
    if any(name not in param_shapes for name in in_buckets):
        raise ValueError(f"{path}: saved for a different model: "
                         f"{sorted(set(in_buckets) - set(param_shapes))}")
    main_params = (dict(zip(in_buckets, state["master_params"], strict=True))
                   if state["master_params"] else {})
    pieces = []
    for bucket, adam in zip(state["layout"], state["bucket_optimizers"], strict=True):
        for name, exp_avg, exp_avg_sq, step in zip(grouped_order(bucket, param_shapes),
                                                   adam["exp_avg"], adam["exp_avg_sq"],
                                                   adam["step"], strict=True):
            if list(exp_avg.shape) != param_shapes[name]:
                raise ValueError(f"{path}: saved for a different model: {name} has shape "
                                 f"{list(exp_avg.shape)}, here {param_shapes[name]}")
            pieces.append(_whole_piece(name, exp_avg, exp_avg_sq, step, main_params.get(name)))
    return {"format": SHARD_FORMAT, "version": STATE_VERSION, "kind": "OverlappedAdamW",
            "world_size": 1, "rank": 0, "lr": state["bucket_optimizers"][0]["lr"],
            "grad_scaler": None, "param_shapes": param_shapes, "pieces": pieces}


def _saved_states(optim_dir: Path, param_shapes: dict[str, list[int]],
                  trainable: Collection[str]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(file, shard state) of every file of the save, one at a time: the shard files, or a
    ZeRO-0 run's replicated file or the overlapped optimizer's read as whole pieces."""
    replicated, overlapped = (optim_dir / REPLICATED_CHECKPOINT_FILE,
                              optim_dir / OVERLAPPED_CHECKPOINT_FILE)
    if replicated.is_file():
        yield replicated, _replicated_as_pieces(replicated, param_shapes, trainable)
        return
    if overlapped.is_file():
        yield overlapped, _overlapped_as_pieces(overlapped, param_shapes)
        return
    for path in find_shard_files(optim_dir):
        yield path, torch.load(path, map_location="cpu", weights_only=True)


def load_resharded_state(optim_dir: Path, my_pieces: list[tuple[str, int, int]],
                         param_shapes: dict[str, list[int]], rank: int,
                         world_size: int, trainable: Collection[str]) -> dict[str, Any]:
    """A shard state dict for (rank, world_size) whose pieces are `my_pieces` (name, start,
    end), assembled from the files of a save made with any world size, by ZeRO-0 or by the
    overlapped optimizer (module docstring). `trainable`: the names of the parameters with
    optimizer state. A piece's `main_param` is None when the save holds none (an fp32 ZeRO-0
    or overlapped run)."""
    by_name: dict[str, list[int]] = {}
    for index, (name, _, _) in enumerate(my_pieces):
        by_name.setdefault(name, []).append(index)
    values = [{key: torch.empty(end - start) for key in TENSOR_KEYS}
              for _, start, end in my_pieces]
    coverage = [torch.zeros(end - start, dtype=torch.int32) for _, start, end in my_pieces]
    steps: set[int] = set()
    header: dict[str, Any] = {}
    without_main = False
    for path, saved in _saved_states(optim_dir, param_shapes, trainable):
        check_state_header(saved, SHARD_FORMAT, saved.get("kind", "?"))
        if saved["param_shapes"] != param_shapes:
            differ = _differing_params(saved["param_shapes"], param_shapes)
            raise ValueError(f"{path}: saved for a different model; parameters differ: {differ}")
        header = header or saved
        for piece in saved["pieces"]:
            steps.add(piece["step"])
            without_main = without_main or piece["main_param"] is None
            for index in by_name.get(piece["name"], []):
                _, start, end = my_pieces[index]
                low, high = max(start, piece["start"]), min(end, piece["end"])
                if low >= high:
                    continue
                for key in TENSOR_KEYS:
                    if piece[key] is not None:
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
            "pieces": [{"name": name, "start": start, "end": end, "step": step, **value,
                        **({"main_param": None} if without_main else {})}
                       for (name, start, end), value in zip(my_pieces, values)]}


def _differing_params(saved: dict[str, list[int]], current: dict[str, list[int]]) -> list[str]:
    return sorted(name for name in set(saved) | set(current)
                  if saved.get(name) != current.get(name))
