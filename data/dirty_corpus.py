"""Documents for the cleaning stage's tests and bench: real prose (Shakespeare scenes from the
demo's corpus builder) plus generated junk built to trip each rule, and planted near-duplicates."""

from __future__ import annotations

import random

from data.build_demo_corpus import play_files, play_scenes

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
