"""utils.inspect_batch: the printed table agrees with the batch it shows."""

from __future__ import annotations

import json

from utils.inspect_batch import main


def parse_rows(output: str) -> list[list[str]]:
    rows = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split(" | ")]
        if cells[0].isdigit():
            rows.append(cells)
    return rows


def test_sft_table_shows_shifted_labels_and_mask(tmp_path, tiny_hf_tokenizer_dir, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    records = [{"conversations": [{"from": "human", "value": f"question {i}"},
                                  {"from": "gpt", "value": f"answer number {i}"}]}
               for i in range(6)]
    (raw / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    main(["--task_type=sft", f"--data_dir={raw}", f"--tokenizer_dir={tiny_hf_tokenizer_dir}",
          "--max_seq_len=64", "--index=1", "--max_rows=64"])
    rows = parse_rows(capsys.readouterr().out)
    assert rows and [int(row[0]) for row in rows] == list(range(len(rows)))
    trained = 0
    for row, next_row in zip(rows, rows[1:]):
        label, loss = row[3], row[5]
        if loss == "1":
            trained += 1
            assert label == next_row[1]  # the label at t is the input token at t + 1
        else:
            assert label == "-100"
    assert trained > 0
