"""docs/design.md §8.0 ("which parallelism when") stays true and reachable: the README links
to it, every option it names is the trainer's, and it answers the four questions a newcomer
asks (a model too big for a device, long sequences, slow links between nodes, the cost)."""

from __future__ import annotations

import re
from pathlib import Path

from trainer.options import OPTION_TYPES

REPO = Path(__file__).resolve().parents[1]
HEADING = "### 8.0 Which parallelism when"
LAUNCHER_OPTIONS = {"nproc_per_node", "device_memory"}  # torchrun's; tools.memory_plan's


def guide() -> str:
    text = (REPO / "docs/design.md").read_text(encoding="utf-8")
    assert HEADING in text
    return text.split(HEADING, 1)[1].split("\n### ", 1)[0]


def test_the_readme_links_to_the_guide():
    anchor = re.sub(r"[^\w\- ]", "", HEADING.lstrip("# ").lower()).replace(" ", "-")
    assert f"docs/design.md#{anchor}" in (REPO / "README.md").read_text(encoding="utf-8")


def test_the_guide_names_real_options_and_answers_each_question():
    text = guide()
    named = set(re.findall(r"--(\w+)", text))
    assert named - LAUNCHER_OPTIONS <= set(OPTION_TYPES), named - set(OPTION_TYPES)
    for option in ("zero_stage", "tensor_parallel", "context_parallel", "pipeline_parallel"):
        assert option in named
    for question in ("too big for a device", "long sequences", "slow links",
                     "communication per step"):
        assert question in text
