"""Print what the model will actually see: one collated batch as a table, token by token.

    python -m tools.inspect_batch --task_type=sft --data_dir=data/demo/sft \\
        --tokenizer_dir=tokenizer/demo_hf --max_seq_len=128 [--index 0] [--max_rows 40]

Columns: position t, the input token (id and text), the label at t (the token the model must
predict after reading tokens 0..t; `-100` = not trained) and the loss mask (1 = counted in the
loss). For DPO the chosen and rejected sides are printed side by side. The first thing to run
when a loss looks wrong: a label off by one, or a mask over the prompt, is visible at a glance.
"""

from __future__ import annotations

import sys

from dataset.build import TASK_TYPES, build_datasets
from tokenizer import load_tokenizer
from utils.cli_errors import run_main
from utils.labels import IGNORE_INDEX
from utils.option_checks import raise_problems, range_problem
from utils.option_parser import OptionParser
from utils.tokenizer_protocol import Tokenizer

TEXT_WIDTH = 16


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as a short printable string: newlines and tabs escaped, long text clipped."""
    if token_id == IGNORE_INDEX:
        return ""
    text = repr(tokenizer.decode([token_id]))[1:-1]
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 1] + "…"


def side_columns(tokenizer: Tokenizer, batch: dict, row: int, t: int, prefix: str = ""
                 ) -> list[str]:
    input_id = int(batch[prefix + "input_ids"][row, t])
    label = int(batch[prefix + "labels"][row, t])
    attention = batch.get(prefix + "attention_mask")
    padding = attention is not None and int(attention[row, t]) == 0
    return [f"{input_id:>6}", f"{token_text(tokenizer, input_id):<{TEXT_WIDTH}}",
            f"{label:>6}", f"{token_text(tokenizer, label):<{TEXT_WIDTH}}",
            "pad".rjust(4) if padding else str(int(label != IGNORE_INDEX)).rjust(4)]


def format_batch(tokenizer: Tokenizer, batch: dict, max_rows: int) -> str:
    """The table for every row of a collated batch (first `max_rows` positions of each)."""
    sides = ["chosen_", "rejected_"] if "chosen_input_ids" in batch else [""]
    one_side = ["id".rjust(6), "input".ljust(TEXT_WIDTH), "label".rjust(6),
                "target".ljust(TEXT_WIDTH), "loss"]
    header = " | ".join(["pos".rjust(4)] + one_side * len(sides))
    lines = [] if len(sides) == 1 else ["left: chosen, right: rejected"]
    for row in range(batch[sides[0] + "input_ids"].shape[0]):
        length = batch[sides[0] + "input_ids"].shape[1]
        trained = [int((batch[side + "labels"][row] != IGNORE_INDEX).sum()) for side in sides]
        lines.append(f"--- sample {row}: {length} positions, trained positions "
                     f"{' / '.join(map(str, trained))} ---")
        lines.append(header)
        for t in range(min(length, max_rows)):
            columns = [f"{t:>4}"]
            for side in sides:
                columns += side_columns(tokenizer, batch, row, t, side)
            lines.append(" | ".join(columns))
        if length > max_rows:
            lines.append(f"... {length - max_rows} more positions (--max_rows)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task_type", choices=TASK_TYPES, required=True,
                        help="which dataset and collator to build, as in train_my_ddp.py")
    parser.add_argument("--data_dir", required=True, help="as given to train_my_ddp.py")
    parser.add_argument("--tokenizer_dir", required=True,
                        help="the saved tokenizer the data was (or will be) tokenized with")
    parser.add_argument("--max_seq_len", type=int, default=256,
                        help="tokens per sample, as given to train_my_ddp.py")
    parser.add_argument("--split", choices=("train", "valid"), default="train",
                        help="show training or validation samples")
    parser.add_argument("--seed", type=int, default=1337,
                        help="as given to train_my_ddp.py: it draws the SFT/DPO valid split")
    parser.add_argument("--index", type=int, default=0, help="first sample of the batch")
    parser.add_argument("--batch_size", type=int, default=1,
                        help="samples collated together (padding shows as 'pad')")
    parser.add_argument("--max_rows", type=int, default=40, help="positions shown per sample")
    args = parser.parse_args(argv)
    raise_problems([range_problem("--max_seq_len", args.max_seq_len, 2),
                    range_problem("--index", args.index, 0),
                    range_problem("--batch_size", args.batch_size, 1),
                    range_problem("--max_rows", args.max_rows, 1)])
    tokenizer = load_tokenizer(args.tokenizer_dir)
    train, valid, collate_fn = build_datasets(args.task_type, args.data_dir, tokenizer,
                                              args.max_seq_len, seed=args.seed)
    dataset = train if args.split == "train" else valid
    stop = min(args.index + args.batch_size, len(dataset))
    if not 0 <= args.index < stop:
        raise ValueError(f"--index {args.index} outside the {args.split} set ({len(dataset)})")
    batch = collate_fn([dataset[i] for i in range(args.index, stop)])
    print(f"{args.task_type} {args.split} samples {args.index}..{stop - 1} of {len(dataset)}; "
          "label = the token to predict at this position, -100 = not trained")
    print(format_batch(tokenizer, batch, args.max_rows))


if __name__ == "__main__":
    sys.exit(run_main(main))
