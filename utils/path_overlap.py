"""Whether an output folder and a path a command reads overlap: the one comparison behind the
rule of every tool that writes a folder, "never write into what you read" (the trainer's
--out_dir and convert_to_hf --out, utils/run_ownership.py; tools.evaluate --report_dir; the data
tools' --out_dir, utils/data_output_dir.py; clean_pretrain_data --write_dropped,
data_preprocess/cleaning/dropped.py). Each caller words its own one-line refusal.

    path_overlap("out/run1", "data/demo")        None      apart
    path_overlap("data2", "data")                None      apart (a shared prefix is no parent)
    path_overlap("data/demo", "data/demo")       "same"    the input would be written over
    path_overlap("data", "data/demo")            "holds"   the input too, from above
    path_overlap("data/demo/out", "data/demo")   "inside"  the outputs would be read as input

Both paths are resolved first (symlinks followed, `..` folded, relative to the working
directory), so a link to the input is the input; neither needs to exist.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

Overlap = Literal["same", "holds", "inside"]


def path_overlap(output: str | os.PathLike, source: str | os.PathLike) -> Overlap | None:
    """How `output` meets `source`: the same folder, `output` above it ("holds"), `output`
    below it ("inside"), or None when they are apart."""
    output_path, source_path = Path(output).resolve(), Path(source).resolve()
    if output_path == source_path:
        return "same"
    if output_path in source_path.parents:
        return "holds"
    if source_path in output_path.parents:
        return "inside"
    return None
