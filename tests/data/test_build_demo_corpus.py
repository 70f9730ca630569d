"""The demo corpus: reproducible bytes, clean real prose hidden among a dirty share, correct
and held-out task data."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from data.build_demo_corpus import build, main, pretrain_scenes
from data.demo_tasks import TASKS, is_correct
from data.dirty_corpus import BOILERPLATE
from data.shakespeare import play_files
from utils.data_files import find_data_files
from utils.data_output_dir import LEDGER
from utils.readers import iter_records, iter_texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    build(out, seed=0)
    return out


def file_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_other_seed_other_tasks(tmp_path, capsys):
    main(["--out", str(tmp_path / "a"), "--seed", "3", "--scale", "0.1"])
    assert "total" in capsys.readouterr().out
    main(["--out", str(tmp_path / "b"), "--seed", "3", "--scale", "0.1"])
    main(["--out", str(tmp_path / "c"), "--seed", "4", "--scale", "0.1"])
    first, again, other = (file_bytes(tmp_path / name) for name in "abc")
    assert first.pop(f"pretrain/{LEDGER}") == again.pop(f"pretrain/{LEDGER}")  # for clean
    assert len(first) == 16 and first == again
    assert not any("/." in "/" + name for name in first)  # no temporary files left behind
    assert first["sft/train_openai.jsonl"] != other["sft/train_openai.jsonl"]
    plays = "pretrain_raw/shakespeare_comedies.jsonl"
    assert first[plays] != other[plays]  # the dirty share moves with the seed, the scenes not


WORD = re.compile(r"[A-Za-z']+")


def test_plays_become_clean_scenes_that_keep_every_word():
    """Reference: the words of each Markdown play minus its heading lines must equal the words
    of its scene documents minus their one-line headers, in the same order."""
    all_scenes = pretrain_scenes()
    for group, paths in play_files().items():
        scenes = all_scenes[f"shakespeare_{group}.jsonl"]
        for text in scenes:
            assert not set(text) & set("*_#\\"), "markup left in the text"
            assert "\n\n\n" not in text and text == text.strip()
        body_words = [w for text in scenes for w in WORD.findall(text.split("\n", 1)[1])]
        source_words = [w for path in paths for line in path.read_text().splitlines()
                        if not line.startswith("#") for w in WORD.findall(line)]
        assert body_words == source_words
        headings = sum(line.startswith(("## ", "### ", "#### ")) and "ACT" not in line
                       for path in paths for line in path.read_text().splitlines())
        assert len(scenes) >= headings * 0.95  # about one document per scene/prologue


def test_raw_plays_hold_the_scenes_in_order_and_each_copy_after_its_original(corpus):
    """The cleaner keeps the first of each group of copies in source order, so from these files
    it can keep only the scenes, in order (tests/tools/test_demo.py runs it on them)."""
    for index, (name, scenes) in enumerate(pretrain_scenes().items()):
        raw, good = list(iter_texts(corpus / "pretrain_raw" / name)), set(scenes)
        first_place = {}
        for place, text in enumerate(raw):
            first_place.setdefault(text, place)
        assert sorted(scenes, key=first_place.__getitem__) == scenes
        dirt = [text for place, text in enumerate(raw) if first_place[text] != place
                or text not in good]
        # a verbatim and a one-line copy, a near copy, the boilerplate, the leak (first file)
        assert len(dirt) == 3 + len(BOILERPLATE) + (index == 0), name
        assert set(BOILERPLATE.values()) <= set(dirt)
        for scene in scenes:  # a copy on one line is an exact copy to the cleaner, too
            one_line = first_place.get(" ".join(scene.split()), len(raw))
            assert one_line > first_place[scene], name


def test_pretrain_size_and_cjk_share(corpus):
    files = find_data_files([corpus / "pretrain_raw", corpus / "pretrain"])
    assert 3e6 < sum(path.stat().st_size for path in files) < 6.5e6
    bilingual = "".join(iter_texts(corpus / "pretrain/bilingual_zh_en.jsonl"))
    cjk = sum("\u4e00" <= ch <= "\u9fff" for ch in bilingual)
    distinct = {ch for ch in bilingual if "\u4e00" <= ch <= "\u9fff"}
    assert cjk > 50_000 and len(distinct) > 100


def reference_answer(task: str, prompt: str) -> str:
    """The rules, re-derived here from the prompt text alone (not via data.demo_tasks)."""
    if task in ("add1", "add2"):
        a, b = (int(n) for n in re.findall(r"\d+", prompt))
        assert (a < 10 and b < 10) == (task == "add1")
        return str(a + b)
    (word,) = re.findall(r'"(\w+)"', prompt)
    return {"copy": word, "upper": word.upper(), "length": str(len(word)),
            "reverse": word[::-1]}[task]


def task_of(prompt: str) -> str:
    """Which task a prompt belongs to, from its template."""
    matches = [name for name, task in TASKS.items() for template in task.templates
               if re.fullmatch(re.escape(template).replace(r"\{word\}", "[a-z]+")
                               .replace(r"\{a\}", r"\d+").replace(r"\{b\}", r"\d+"), prompt)]
    if {"add1", "add2"} & set(matches):
        return "add1" if max(map(int, re.findall(r"\d+", prompt))) < 10 else "add2"
    (task,) = matches
    return task


def user_turns_and_answers(data: dict) -> list[tuple[str, str]]:
    """(prompt, answer) pairs of an SFT record in any of the three formats."""
    if "instruction" in data:
        assert data["input"] == ""
        return [(data["instruction"], data["output"])]
    messages = data.get("messages") or [{"role": {"human": "user", "gpt": "assistant"}.get(
        m["from"], m["from"]), "content": m["value"]} for m in data["conversations"]]
    messages = [m for m in messages if m["role"] != "system"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)
    return [(u["content"], a["content"]) for u, a in zip(messages[::2], messages[1::2])]


def test_sft_answers_are_correct_and_eval_is_held_out(corpus):
    held_out = [record.data for record in iter_records(corpus / "eval/tasks.jsonl")]
    eval_prompts = {item["prompt"] for item in held_out}
    assert len(eval_prompts) == len(held_out)
    for item in held_out:
        assert task_of(item["prompt"]) == item["task"]
        assert item["answer"] == reference_answer(item["task"], item["prompt"])

    seen_formats = set()
    for path in find_data_files(corpus / "sft"):
        for record in iter_records(path):
            seen_formats |= {"instruction", "messages", "conversations"} & set(record.data)
            for prompt, answer in user_turns_and_answers(record.data):
                assert prompt not in eval_prompts, f"{path}:{record.number} leaks an eval prompt"
                assert answer == reference_answer(task_of(prompt), prompt)
    assert seen_formats == {"instruction", "messages", "conversations"}


def test_dpo_chosen_right_rejected_wrong_and_held_out(corpus):
    eval_prompts = {r.data["prompt"] for r in iter_records(corpus / "eval/tasks.jsonl")}
    shapes = set()
    for path in find_data_files(corpus / "dpo"):
        for record in iter_records(path):
            data = record.data
            if "conversations" in data:
                shapes.add("conversations")
                (turn,) = data["conversations"]
                assert turn["from"] == "human" and data["chosen"]["from"] == "gpt"
                prompt, chosen, rejected = (turn["value"], data["chosen"]["value"],
                                            data["rejected"]["value"])
            else:
                shapes.add("prompt")
                prompt, chosen, rejected = data["prompt"], data["chosen"], data["rejected"]
            assert prompt not in eval_prompts
            expected = reference_answer(task_of(prompt), prompt)
            assert chosen == expected and rejected != expected and rejected.strip()
    assert shapes == {"conversations", "prompt"}


def test_grpo_prompts_are_chat_prompts_of_the_missed_skills_and_held_out(corpus):
    eval_prompts = {r.data["prompt"] for r in iter_records(corpus / "eval/tasks.jsonl")}
    tasks = set()
    for record in iter_records(corpus / "grpo/train.jsonl"):
        ((message,),) = [record.data["prompt"]]
        assert message["role"] == "user" and message["content"] not in eval_prompts
        assert task_of(message["content"]) == record.data["task"]
        assert record.data["answer"] == reference_answer(record.data["task"],
                                                         message["content"])
        tasks.add(record.data["task"])
    assert tasks == {"add1", "add2", "copy", "reverse"}


def test_is_correct_matches_reference_and_ignores_only_whitespace():
    rng = random.Random()
    for name, task in TASKS.items():
        for _ in range(200):
            prompt, answer = task.sample(rng)
            assert task_of(prompt) == name
            assert answer == reference_answer(name, prompt)
            assert is_correct(name, prompt, rng.choice(["", " ", "\n"]) + answer + " \n")
            assert not is_correct(name, prompt, answer + ".")
            assert not is_correct(name, prompt, task.wrong_answer(rng, prompt))
