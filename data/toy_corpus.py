"""A deterministic toy corpus for tests and benchmarks: many scripts in a few kilobytes.

Tokenizer and preprocessing code must cope with more than English, so the toy documents mix
English words, made-up syllable words, Chinese, Japanese, code snippets, numbers, emoji and odd
whitespace, e.g. (one document, shortened):
    "the kamen 我们的模型 です def f(x):\n    return x * 2\n 2024 😀 learns"
The same `seed` always gives the same documents, so a tokenizer trained on them is reproducible.
"""

from __future__ import annotations

import random

_SYLLABLES = ["ka", "to", "ri", "men", "ste", "qu", "ol", "ph", "an", "ing", "tion", "er", "th",
              "sh", "ou", "ra", "ve", "ly"]
_ENGLISH = ["the", "model", "reads", "text", "and", "learns", "to", "predict", "next", "token",
            "while", "we", "train", "it", "on", "many", "documents", "every", "day"]
_CHINESE = "我们的模型在训练数据上学习预测下一个词语中文分词很有意思今天天气好人工智能大"
_JAPANESE = ["日本語", "テキスト", "です", "ます", "カタカナ", "ひらがな"]
_CODE = ["def f(x):\n    return x * 2\n", "for i in range(10):\n\tprint(i)\n",
         "if a == b:  # compare\n    a += 1\n", "{\"key\": [1, 2, 3]}"]
_EXTRAS = ["12345", "2024", "3.14159", "😀", "🚀", "naïve", "café", "  ", "\n\n", "\t", "—",
           "。", "，"]


def multilingual_corpus(num_documents: int = 1500, seed: int = 0) -> list[str]:
    """Deterministic toy documents mixing English, Chinese, Japanese, code, numbers and emoji."""
    rng = random.Random(seed)
    made_up = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
               for _ in range(400)]

    def word() -> str:
        kind = rng.random()
        if kind < 0.35:
            return rng.choice(_ENGLISH)
        if kind < 0.6:
            return rng.choice(made_up)
        if kind < 0.8:
            return "".join(rng.choice(_CHINESE) for _ in range(rng.randint(1, 6)))
        if kind < 0.88:
            return rng.choice(_JAPANESE)
        if kind < 0.92:
            return rng.choice(_CODE)
        if kind < 0.96:
            return str(rng.choice([7, 12, 2024, 365, 100]) * rng.randint(1, 99))
        return rng.choice(_EXTRAS)

    return [" ".join(word() for _ in range(rng.randint(5, 60))) for _ in range(num_documents)]
