"""Build the demo corpus: `python -m data.build_demo_corpus --out data/demo [--seed 0]`.

Everything is made on this machine in seconds, with no network, and is a pure function of the
seed (same seed -> the same bytes), so every `make demo` trains on identical data.

    data/demo/pretrain_raw/shakespeare_<group>.jsonl  {"text"}: one document per scene
                                (data/shakespeare.py), as a crawl would deliver them: with
                                copies, near copies, boilerplate pages and one page that leaks
                                an eval item mixed in (data/dirty_corpus.py), for the demo's
                                clean stage to remove; it writes the scenes to pretrain/
    data/demo/pretrain/bilingual_zh_en.jsonl      {"text"}: templated Chinese+English lessons
                                (listed in pretrain/.z2all_outputs.json as a guest of the
                                clean stage's output folder, docs/design.md §2.4a)
    data/demo/sft/train_{sharegpt,openai,alpaca}.jsonl  the demo skills (data/demo_tasks.py)
    data/demo/sft/valid.jsonl                           in the three SFT formats of design.md §2.1
    data/demo/dpo/train_{conversations,prompt}.jsonl    chosen = correct, rejected = near miss,
    data/demo/dpo/valid.jsonl                           in both DPO formats of docs/design.md §2.1
    data/demo/grpo/train.jsonl                    {"prompt": messages, "task", "answer"}: GRPO's
                                                   prompts (add1, add2, copy, reverse)
    data/demo/eval/tasks.jsonl                    {"task", "prompt", "answer"}: held out; no
                                                   prompt here occurs in any other file

Why one document per *scene*: a scene is a coherent unit (same place, same people) of a few
thousand words, long enough to fill a training window with connected text; single speeches
are mostly one-liners, which would make the model learn document boundaries more than English.
The bilingual part exists so tokenizers meet enough CJK text to learn merges for it. It goes
straight to pretrain/, around the clean stage: it is generated here, not crawled, and Gopher's
rules are rules for English (they would drop 81% of the lessons: few English stop words, and
Chinese has no spaces to count words by); a real pipeline filters each language by its own.
Validation files are named `valid*`: that is how dataset/chat_store.py tells them apart.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from data.bilingual_text import bilingual_lesson
from data.demo_tasks import TASKS
from data.dirty_corpus import BOILERPLATE, leaked_eval_page, with_dirty_share
from data.shakespeare import play_files, play_scenes
from utils.atomic_io import atomic_open
from utils.cli_errors import run_main
from utils.data_output_dir import OutputLedger
from utils.option_parser import OptionParser

SYSTEM_PROMPT = "You are a careful assistant. Answer with the result only."


def scaled(count: int, scale: float) -> int:
    """`count` shrunk by `scale` (--scale), never below one."""
    return max(1, round(count * scale))


# ---------------------------------------------------------------------------------------------
# Pretraining text: the scenes, and the raw files they hide in.
# ---------------------------------------------------------------------------------------------


def pretrain_scenes(scale: float = 1.0) -> dict[str, list[str]]:
    """{file name: its scenes in play order}: what the demo pretrains on once cleaned."""
    scenes = {}
    for group, paths in play_files().items():
        chosen = paths[:scaled(len(paths), scale)]
        scenes[f"shakespeare_{group}.jsonl"] = [
            scene for path in chosen for scene in play_scenes(path.read_text(encoding="utf-8"))]
    return scenes


def raw_pretrain_files(scale: float, leak: tuple[str, str],
                       rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """{file name: records} of pretrain_raw/: each file's scenes with a dirty share mixed in
    (the boilerplate pages in every file, like a site's menu on every page; the page leaking
    `leak`, a held-out (prompt, answer), in the first file only)."""
    files = {}
    for index, (name, scenes) in enumerate(pretrain_scenes(scale).items()):
        pages = [*BOILERPLATE.values(), *([leaked_eval_page(*leak)] if index == 0 else [])]
        files[name] = [{"text": text} for text in with_dirty_share(scenes, rng, pages)]
    return files


# ---------------------------------------------------------------------------------------------
# SFT, DPO and evaluation records for the demo skills.
# ---------------------------------------------------------------------------------------------


Example = tuple[str, str, str]  # (task, prompt, answer)
GRPO_TASKS = ("add1", "add2", "copy", "reverse")
RecordMaker = Callable[[random.Random, list[Example]], dict[str, Any]]


def draw_examples(rng: random.Random, count: int, exclude: set[str],
                  tasks: Iterable[str] = TASKS) -> list[Example]:
    """`count` (task, prompt, answer) triples, `tasks` in turn, prompts never in `exclude`."""
    examples, names = [], sorted(tasks)
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

    held_out = draw_held_out(rng_for("eval"), per_task=scaled(50, scale))
    # The leaked prompt has 5+ words, so the demo's clean stage matches it (tools/demo.py).
    leak = next((prompt, answer) for _, prompt, answer in held_out if len(prompt.split()) >= 5)
    files: dict[str, list[dict[str, Any]]] = {
        f"pretrain_raw/{name}": records
        for name, records in raw_pretrain_files(scale, leak, rng_for("dirt")).items()}
    bilingual_rng = rng_for("bilingual")
    files["pretrain/bilingual_zh_en.jsonl"] = [
        {"text": bilingual_lesson(bilingual_rng)} for _ in range(scaled(1000, scale))]

    files["eval/tasks.jsonl"] = [{"task": t, "prompt": p, "answer": a} for t, p, a in held_out]
    exclude = {prompt for _, prompt, _ in held_out}

    sft_rng = rng_for("sft")
    for name, make_record in [("sharegpt", sharegpt_record), ("openai", openai_record),
                              ("alpaca", alpaca_record)]:
        examples = draw_examples(sft_rng, scaled(6000, scale), exclude)
        files[f"sft/train_{name}.jsonl"] = sft_records(sft_rng, examples, make_record)
    examples = draw_examples(sft_rng, scaled(300, scale), exclude)
    files["sft/valid.jsonl"] = sft_records(sft_rng, examples, openai_record)

    dpo_rng = rng_for("dpo")
    for name, make_record, count in [("train_conversations", dpo_conversations_record, 2500),
                                     ("train_prompt", dpo_prompt_record, 2500),
                                     ("valid", dpo_prompt_record, 200)]:
        files[f"dpo/{name}.jsonl"] = [make_record(dpo_rng, *example) for example in
                                      draw_examples(dpo_rng, scaled(count, scale), exclude)]

    # GRPO: the skills DPO leaves below 100% (docs/demo.md), as chat prompts with the task for
    # the reward function (trainer/reward_functions.py `demo_task_correct`)
    files["grpo/train.jsonl"] = [
        {"prompt": [{"role": "user", "content": prompt}], "task": task, "answer": answer}
        for task, prompt, answer in draw_examples(rng_for("grpo"), scaled(2000, scale), exclude,
                                                  tasks=GRPO_TASKS)]

    # pretrain/ is the clean stage's output folder: the lessons are listed there as a guest's
    # (utils/data_output_dir.py), so the clean stage writes beside them and never removes them.
    OutputLedger.record(out / "pretrain", ["bilingual_zh_en.jsonl"], "build_demo_corpus")
    return {relative: write_jsonl(out / relative, records)
            for relative, records in files.items()}


def main(argv: list[str] | None = None) -> None:
    parser = OptionParser(description=__doc__.split("\n")[0])
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
