"""utils/run_ownership.py: the one list of what a run writes, as docs/design.md 2.7 shows it,
and what counts as foreign in a run's directory. (The trainer, the supervisor and the tools
are tested through their entry points: tests/trainer/test_run_dir_guard.py,
tests/monitor/test_supervisor_lock.py, tests/model/test_convert_to_hf.py,
tests/tools/test_evaluate.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from utils.run_ownership import RUN_FILES, RUN_FOLDERS, foreign_entry

REPO = Path(__file__).resolve().parents[2]
RUN_CONFIG = '{"task_type": "sft"}'


def test_the_design_docs_tree_names_every_entry_of_the_list():
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    tree = design.split("### 2.7 The run directory", 1)[1].split("```", 2)[1]
    def shown(name: str) -> bool:
        return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", tree) is not None

    missing = [name for name in RUN_FILES if not shown(name)]
    missing += [f"{name}/" for name in RUN_FOLDERS if not shown(f"{name}/")]
    assert not missing, f"docs/design.md 2.7 does not show {missing}"


@pytest.mark.parametrize("layout, foreign", [
    ({"config.json": RUN_CONFIG, ".config.json.k3j2.tmp": "", ".heartbeat.tmp": "",
      ".tokenizer.x8q1/tokenizer.json": "", "ckpt/.tmp_step_000002/x": "",
      "tokenizer/tokenizer.json": "", "plots/loss.png": ""}, None),
    ({"config.json": '{"model_type": "llama"}'}, "config.json"),
    ({"report.md": "# Run report: a\n", "plots/loss.svg": ""}, "plots/loss.svg"),
    ({"ckpt/step_000002/x": "", "ckpt/notes.txt": ""}, "ckpt/notes.txt"),
    ({".notes.txt": ""}, ".notes.txt"),
    ({"heartbeat/x": ""}, "heartbeat"),
    ({"nodes/node0.monitor.lock": "", "nodes/node1.monitor.log": "",
      "shared_filesystem_check": ""}, None),
    ({"nodes/node0.monitor.log": "", "nodes/hostfile": ""}, "nodes/hostfile"),
], ids=["temporaries", "hf-config", "plot-format", "ckpt-note", "hidden-file", "dir-as-file",
        "node-supervisors", "node-note"])
def test_foreign_entries(tmp_path, layout, foreign):
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert foreign_entry(tmp_path) == foreign
