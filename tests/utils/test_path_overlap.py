"""utils/path_overlap.py: the one comparison behind "an output folder is never an input, never
holds one, never lies inside one". Its callers' refusals are tested through their entry points
(tests/trainer/test_run_dir_guard.py, tests/model/test_convert_to_hf.py,
tests/tools/test_evaluate.py, tests/data_preprocess/test_output_ownership.py,
tests/test_reliability.py, tests/data_preprocess/cleaning/test_clean_options.py)."""

from __future__ import annotations

import pytest

from utils.path_overlap import path_overlap


@pytest.mark.parametrize("output, source, expected", [
    ("data/demo", "data/demo", "same"),
    ("data/demo/../demo/", "data/demo", "same"),  # spelled otherwise
    ("data", "data/demo", "holds"),  # the input inside the output
    (".", "data/demo", "holds"),
    ("data/demo/out", "data/demo", "inside"),  # the output inside the input
    ("data/demo/a/b", "data/demo", "inside"),
    ("link_to_demo", "data/demo", "same"),  # a symlink resolving to the input
    ("link_to_demo/out", "data/demo", "inside"),
    ("data", "link_to_demo", "holds"),
    ("out/run1", "data/demo", None),  # unrelated
    ("data2", "data", None),  # a shared prefix is no parent
    ("data/demo2", "data/demo", None),
    ("data/new", "data/demo", None),  # siblings, neither existing
])
def test_how_an_output_meets_an_input(tmp_path, monkeypatch, output, source, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "demo").mkdir(parents=True)
    (tmp_path / "data2").mkdir()
    (tmp_path / "link_to_demo").symlink_to(tmp_path / "data" / "demo")
    assert path_overlap(output, source) == expected
    assert path_overlap(tmp_path / output, tmp_path / source) == expected  # absolute alike
