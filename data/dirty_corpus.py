"""Dirt for the cleaning stage (data_preprocess/clean_pretrain_data.py): real prose (Shakespeare
scenes) plus generated junk built to trip each rule, planted near-duplicates, the boilerplate a
crawler brings in, and a page that leaks an evaluation item. The tests and bench use the
generators; the demo corpus (build_demo_corpus.py) mixes `with_dirty_share` into its scenes so
the demo's clean stage has something real to remove."""

from __future__ import annotations

import random
from collections.abc import Sequence

from data.shakespeare import play_files, play_scenes

WORDS = ("the", "of", "and", "to", "in", "that", "have", "with", "be", "it", "is", "was",
         "for", "on", "as", "at", "by", "from", "this", "king", "lord", "sword", "crown",
         "night", "love", "death", "heaven", "earth", "shall", "would", "could")


def shakespeare_scenes(count: int) -> list[str]:
    """The first `count` scenes over the plays, in a fixed order."""
    scenes: list[str] = []
    for paths in play_files().values():
        for path in paths:
            scenes.extend(play_scenes(path.read_text(encoding="utf-8")))
            if len(scenes) >= count:
                return scenes[:count]
    return scenes


def junk(rng: random.Random) -> str:
    """One generated document of a random kind; several kinds sit near a rule's threshold."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(20, 400))]
    kind = rng.randrange(10)
    if kind == 0:  # hashtag spam
        return " ".join(w if rng.random() > rng.uniform(0.05, 0.2) else "#" + w for w in words)
    if kind == 1:  # bullet menus
        return "\n".join(("- " if rng.random() < rng.uniform(0.8, 1) else "") + w for w in words)
    if kind == 2:  # teaser lines
        return "\n".join(" ".join(words[i:i + 6]) + ("..." if rng.random() < 0.35 else ".")
                         for i in range(0, len(words), 6))
    if kind == 3:  # numbers and symbols
        return " ".join(w if rng.random() > 0.25 else str(rng.randint(0, 99999)) for w in words)
    if kind == 4:  # repeated lines
        lines = [" ".join(rng.sample(WORDS, 5)) for _ in range(rng.randint(3, 12))]
        return "\n".join(rng.choice(lines) for _ in range(rng.randint(10, 40)))
    if kind == 5:  # one phrase looping
        phrase = " ".join(rng.sample(WORDS, rng.randint(2, 5)))
        return " ".join([phrase] * rng.randint(3, 30) + words[:rng.randint(0, 200)])
    if kind == 6:  # long random "words"
        return " ".join("".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(1, 14)))
                        for _ in words)
    if kind == 7:  # repeated paragraphs
        paragraphs = [" ".join(rng.sample(WORDS, 8)) for _ in range(4)]
        return "\n\n".join(rng.choice(paragraphs) for _ in range(rng.randint(3, 12)))
    if kind == 8:  # a short fragment
        return " ".join(words[:rng.randint(5, 70)])
    return " ".join(words)  # plain word salad: passes or fails on stop words / length


def near_copy(text: str, rng: random.Random, fraction: float) -> str:
    """`text` with about `fraction` of its words replaced by other words."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, int(fraction * len(words)))):
        words[i] = rng.choice(WORDS) + "x"
    return " ".join(words)


def distinct_documents(rng: random.Random, count: int, length: int = 300) -> list[str]:
    """Documents that share vocabulary but no long passages (pairwise Jaccard near 0)."""
    vocabulary = [f"w{i}" for i in range(5000)] + list(WORDS)
    return [" ".join(rng.choice(vocabulary) for _ in range(length)) for _ in range(count)]


# The pages around the text a crawler wants, each keyed by the Gopher rule that drops it (with
# the demo's --min_stop_words 1): the same menu, footer or comment thread repeats on every page
# of a site, so a raw web crawl holds many copies of each.
SECTIONS = ("Home", "Plays", "Sonnets", "Poems", "Characters", "Quotations", "Glossary",
            "Timeline", "Search", "About", "Contact", "Donate")
BOILERPLATE = {
    "too_few_words": "404 Not Found\n\nThe page you requested has moved or no longer exists. "
                     "Return to the home page or search the archive.",
    "mostly_bullet_lines": "\n".join(f"- {section} › {part}" for section in SECTIONS
                                     for part in ("Overview", "Texts", "Notes", "Audio")),
    "too_many_hashes": 4 * ("Tonight at the Globe! #Shakespeare #theatre #London #tickets "
                            "#sale Book now and save on the best seats in the house #deal "
                            "#offer #cheap "),
    "mostly_ellipsis_lines": "\n".join(
        f"{play}, act {act}, scene {scene}: the full text with notes and ..."
        for play in ("Hamlet", "Macbeth", "Othello", "King Lear")
        for act, scene in ((1, 1), (2, 2), (3, 1))),
    "too_few_alpha_words": "Price list, 2024 season\n" + "\n".join(
        f"{row:02d} | {row * 7 % 31 + 10}.{row * 13 % 100:02d} | {1000 + row * 17}"
        for row in range(1, 25)),
    "duplicate_lines": "\n".join(
        line for n in range(1, 13) for line in (
            f"Comment {n} by a reader of the site, on the scene and its staging",
            "Reply", "Share", "Report this comment")),
}


def leaked_eval_page(prompt: str, answer: str) -> str:
    """Good prose that quotes one evaluation item with its answer, the way answer keys and
    forum posts leak benchmarks into crawls: only decontamination can tell it from a good
    page."""
    return ("Word games for a rainy afternoon\n\n"
            "The rules of this game are simple, and children love it: one player asks a "
            "question about a made-up word, and the others race to give the answer first. "
            "Here is a question from the list we use at home, with the answer that won the "
            f"round.\n\nQuestion: {prompt}\nAnswer: {answer}\n\n"
            "Make up your own words and questions, write them on cards, and keep the answers "
            "on the back of each card, so that nobody has to argue about who was right.")


def with_dirty_share(scenes: list[str], rng: random.Random, pages: Sequence[str]) -> list[str]:
    """`scenes` as a crawl delivers them: two copies of one scene (verbatim, and on one line,
    as a scraper that loses line breaks writes it), a near copy of a long scene (1% of its
    words replaced; a short scene with one word changed would fall below the 0.7 Jaccard
    threshold), and `pages` at random places.

    Every copy comes after its original: the cleaner keeps the first document of a group in
    source order, so what it keeps of the result is exactly `scenes`, in their order.
    """
    copied = rng.randrange(len(scenes))
    near = rng.choice([i for i, scene in enumerate(scenes) if len(scene.split()) >= 500])
    dirt = [(copied + 1, scenes[copied]), (copied + 1, " ".join(scenes[copied].split())),
            (near + 1, near_copy(scenes[near], rng, 0.01)), *((0, page) for page in pages)]
    # Each piece goes before a random scene at or after the earliest place it may take (a
    # position of len(scenes): at the end); pieces for the same place keep their order.
    placed = sorted((rng.randint(earliest, len(scenes)), order, text)
                    for order, (earliest, text) in enumerate(dirt))
    documents = list(scenes)
    for inserted, (position, _, text) in enumerate(placed):
        documents.insert(position + inserted, text)
    return documents
