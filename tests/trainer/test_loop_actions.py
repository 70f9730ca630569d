"""The training loop's logging reports what the stream dropped or cut (trainer/loop_actions.py).

Reference: the data loader's own count (`StreamLoader.policy_counts`, checked against the
offline pretokenizer in tests/dataset/test_stream_samples.py); here it must reach stdout,
metrics.jsonl and report.md unchanged.
"""

from __future__ import annotations

from tests.train_helpers import TINY_ARGS, records, run_main


def test_streamed_sft_drops_and_cuts_are_reported(data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [*TINY_ARGS, "--task_type=sft", "--data_format=stream", f"--data_dir={data['sft']}",
            f"--tokenizer_dir={data['tokenizer']}", "--max_seq_len=64", "--max_iters=3",
            "--eval_interval=1000", "--eval_prompts=[]", f"--out_dir={run_dir}"]
    assert run_main(args) == 0
    stdout = capsys.readouterr().out
    last_train = [record for record in records(run_dir, "train")][-1]
    reported = {key: last_train[key] for key in ("too_long_records_dropped",
                                                 "long_records_truncated") if key in last_train}
    assert reported and all(count > 0 for count in reported.values()), last_train
    last_line = [line for line in stdout.splitlines() if line.startswith("[train] step 3 ")][0]
    for key, count in reported.items():
        assert f"{key} {count}" in last_line
        assert f"{key}={count}" in (run_dir / "report.md").read_text()
