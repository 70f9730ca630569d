"""tools.inspect_batch: the printed table of each task (SFT, DPO, pretrain) shows the right
labels and loss mask, checked against the tokenizer's ids and the spec readers of the files."""

from __future__ import annotations

import json

import numpy as np

from data_preprocess.pretokenize_pretrain_data import pretokenize_pretrain_data
from tests.megatron_spec_reader import read_by_spec
from tokenizer import load_tokenizer
from tools.inspect_batch import main


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


def side_columns(rows: list[list[str]], first: int) -> tuple[list[int], list[int], list[str]]:
    """(input ids, labels, loss cells) of one side: columns first, first + 2, first + 4."""
    return ([int(row[first]) for row in rows], [int(row[first + 2]) for row in rows],
            [row[first + 4] for row in rows])


def test_dpo_table_shows_both_sides_with_their_own_replies(tmp_path, tiny_hf_tokenizer_dir,
                                                           capsys):
    """Reference: the tokenizer's own ids of each reply, then <|im_end|>, in the label column
    exactly where the loss column says 1 -- chosen on the left, rejected on the right."""
    raw = tmp_path / "raw"
    raw.mkdir()
    records = [{"prompt": f"question {i}", "chosen": f"right answer {i}",
                "rejected": f"wrong {i} {i}"} for i in range(5)]
    (raw / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (raw / "valid.jsonl").write_text(json.dumps(records[0]) + "\n")
    main(["--task_type=dpo", f"--data_dir={raw}", f"--tokenizer_dir={tiny_hf_tokenizer_dir}",
          "--max_seq_len=64", "--index=3", "--max_rows=64"])
    output = capsys.readouterr().out
    assert "left: chosen, right: rejected" in output
    rows = parse_rows(output)
    tokenizer = load_tokenizer(tiny_hf_tokenizer_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for first, reply in ((1, records[3]["chosen"]), (6, records[3]["rejected"])):
        ids, labels, losses = side_columns(rows, first)
        trained = [label for label, loss in zip(labels, losses) if loss == "1"]
        assert trained == tokenizer.encode(reply, add_special_tokens=False) + [im_end]
        for t, (label, loss) in enumerate(zip(labels, losses)):
            assert (loss == "1") == (label != -100)
            if loss == "1":
                assert label == ids[t + 1]


def test_pretrain_table_trains_every_position(tmp_path, tiny_hf_tokenizer_dir, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jsonl").write_text("".join(
        json.dumps({"text": f"document {i} of a small corpus"}) + "\n" for i in range(30)))
    pretokenize_pretrain_data(raw, tiny_hf_tokenizer_dir, tmp_path / "tok", num_workers=0)
    main(["--task_type=pretrain", f"--data_dir={tmp_path / 'tok'}",
          f"--tokenizer_dir={tiny_hf_tokenizer_dir}", "--max_seq_len=16", "--max_rows=16"])
    ids, labels, losses = side_columns(parse_rows(capsys.readouterr().out), 1)
    # Reference: sample 0 read by the spec readers of .ibin (design.md §2.5) and .bin/.idx (§2.3).
    file_index, offset = np.fromfile(tmp_path / "tok/train_L16.ibin", dtype="<i8")[:2]
    assert file_index == 0
    stream = np.concatenate(read_by_spec(tmp_path / "tok/a")["sequences"]).tolist()
    assert ids == stream[offset: offset + 16] and labels == stream[offset + 1: offset + 17]
    assert losses == ["1"] * 16
