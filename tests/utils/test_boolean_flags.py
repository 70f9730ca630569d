"""A boolean is spelled the same in the trainer and in the argparse tools (utils/boolean_flags.py):
`--skip_bad_records [true|false]`, `--no_skip_bad_records`, `--no-skip_bad_records`, and any
name dashed (`--no-skip-bad-records`, utils/option_parser.py), read by the trainer's parser and
by the pretokenizer alike (which then skips a bad record, or stops)."""

from __future__ import annotations

import json

import pytest

from data_preprocess import pretokenize_pretrain_data
from trainer.command_line import parse_command_line
from utils.cli_errors import run_main

SPELLINGS = [([], False), (["--skip_bad_records"], True), (["--skip_bad_records", "false"], False),
             (["--skip_bad_records=TRUE"], True), (["--skip_bad_records", "1"], True),
             (["--skip_bad_records", "no"], False), (["--no_skip_bad_records"], False),
             (["--no-skip_bad_records"], False), (["--no-skip-bad-records"], False),
             (["--skip-bad-records"], True), (["--skip-bad-records=false"], False)]


@pytest.mark.parametrize("flag, expected", SPELLINGS, ids=[" ".join(s[0]) for s in SPELLINGS])
def test_a_tool_reads_a_boolean_as_the_trainer_does(flag, expected, tmp_path,
                                                    tiny_hf_tokenizer_dir):
    assert parse_command_line(flag)[1].get("skip_bad_records", False) is expected
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw/a.jsonl").write_text(json.dumps({"text": "good"}) + "\n{not json\n")
    argv = ["--data-dir", str(tmp_path / "raw"), "--tokenizer_dir", str(tiny_hf_tokenizer_dir),
            "--out-dir=" + str(tmp_path / "out"), "--num-workers", "0", *flag]  # dashes too
    assert run_main(pretokenize_pretrain_data.main, argv) == (0 if expected else 2)
