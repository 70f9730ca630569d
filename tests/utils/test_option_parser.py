"""Every z2all command line reads `--a-b` as `--a_b` (utils/option_parser.py), as torchrun
does: each argparse tool builds an OptionParser, and a dashed spelling reaches the option
(the trainer's own parser: tests/trainer/test_options.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from utils.option_parser import OptionParser

REPO = Path(__file__).resolve().parents[2]


def test_every_command_line_tool_builds_an_option_parser():
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    plain = [path for path in listed if not path.startswith("tests/")
             and "argparse.ArgumentParser(" in (REPO / path).read_text(encoding="utf-8")]
    assert plain == [], f"build these parsers as utils.option_parser.OptionParser: {plain}"


@pytest.mark.parametrize("argv, expected", [
    (["--eval-interval", "5"], 5),
    (["--eval-interval=6"], 6),
    (["--eval_interval", "7"], 7),
    (["--", "--eval-interval"], 1),  # after `--`: a positional, left alone
], ids=["dashed", "dashed=", "underscored", "after --"])
def test_a_dashed_name_reaches_the_declared_option(argv, expected):
    parser = OptionParser()
    parser.add_argument("--eval_interval", type=int, default=1)
    parser.add_argument("rest", nargs="*")
    assert parser.parse_args(argv).eval_interval == expected
