"""Templated Chinese+English "lessons": the demo corpus's CJK text.

The demo's real prose (Shakespeare) is all English, yet z2all's tokenizers must handle Chinese:
byte-level BPE only learns merges for the 3-byte UTF-8 sequences of CJK characters if it sees
them often. These lessons supply that: every sentence is written in both languages from small
hand-made phrase tables, so the text is grammatical, varied and reproducible from a seed.

Example lesson (one document):
    每天早上，王医生在公园里跑步。 Every morning, Doctor Wang runs in the park.
    这个花园很安静。 This garden is very quiet.
    李老师有三本书。 Teacher Li has three books.
"""

from __future__ import annotations

import random

# (Chinese, English) pairs. English verbs are third person singular: every subject is one person.
# English subjects are written as in mid-sentence and capitalized at the start of one.
PEOPLE = [
    ("小明", "Xiao Ming"), ("李老师", "Teacher Li"), ("王医生", "Doctor Wang"),
    ("我的妈妈", "my mother"), ("他的哥哥", "his elder brother"), ("这个孩子", "this child"),
    ("那位老人", "that old man"), ("张阿姨", "Aunt Zhang"), ("我的朋友", "my friend"),
    ("她的妹妹", "her younger sister"), ("陈先生", "Mr. Chen"), ("一个学生", "a student")
]
ACTIVITIES = [
    ("读书", "reads a book"), ("写信", "writes a letter"), ("做饭", "cooks dinner"),
    ("买水果", "buys fruit"), ("学习中文", "studies Chinese"), ("喝茶", "drinks tea"),
    ("画画", "paints a picture"), ("唱歌", "sings a song"), ("跑步", "runs"),
    ("打篮球", "plays basketball"), ("看电影", "watches a film"), ("种花", "plants flowers"),
    ("修自行车", "repairs a bicycle"), ("弹钢琴", "plays the piano"), ("休息", "rests"),
    ("给朋友打电话", "calls a friend"), ("洗衣服", "washes clothes"), ("钓鱼", "goes fishing")
]
PLACES = [
    ("在图书馆", "in the library"), ("在家里", "at home"), ("在公园里", "in the park"),
    ("在学校", "at school"), ("在火车站", "at the railway station"), ("在河边", "by the river"),
    ("在厨房里", "in the kitchen"), ("在市场上", "at the market"), ("在山上", "on the hill"),
    ("在办公室", "in the office"), ("在海边", "by the sea"), ("在院子里", "in the courtyard")
]
TIMES = [
    ("每天早上", "Every morning"), ("每个星期天", "Every Sunday"), ("下午", "In the afternoon"),
    ("晚上", "In the evening"), ("周末", "At the weekend"), ("冬天", "In winter"),
    ("有时候", "Sometimes"), ("夏天", "In summer"), ("放学以后", "After school")
]
THINGS = [
    ("花园", "garden"), ("房间", "room"), ("城市", "city"), ("天空", "sky"), ("小路", "path"),
    ("湖", "lake"), ("饭馆", "restaurant"), ("教室", "classroom"), ("村子", "village")
]
QUALITIES = [
    ("安静", "quiet"), ("干净", "clean"), ("漂亮", "beautiful"), ("热闹", "lively"),
    ("大", "big"), ("小", "small"), ("老", "old"), ("明亮", "bright"), ("冷", "cold")
]
NUMBERS = [
    ("两", "two"), ("三", "three"), ("四", "four"), ("五", "five"), ("六", "six"),
    ("七", "seven"), ("八", "eight"), ("九", "nine"), ("十", "ten")
]
COUNTED = [
    ("本书", "books"), ("只猫", "cats"), ("个苹果", "apples"), ("支笔", "pens"),
    ("朵花", "flowers"), ("个朋友", "friends"), ("张照片", "photos"), ("条鱼", "fish")
]


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def _daily_routine(rng: random.Random) -> tuple[str, str]:
    (time_zh, time_en), (who_zh, who_en) = rng.choice(TIMES), rng.choice(PEOPLE)
    (where_zh, where_en), (act_zh, act_en) = rng.choice(PLACES), rng.choice(ACTIVITIES)
    return f"{time_zh}，{who_zh}{where_zh}{act_zh}。", f"{time_en}, {who_en} {act_en} {where_en}."


def _description(rng: random.Random) -> tuple[str, str]:
    (thing_zh, thing_en), (quality_zh, quality_en) = rng.choice(THINGS), rng.choice(QUALITIES)
    return f"这个{thing_zh}很{quality_zh}。", f"This {thing_en} is very {quality_en}."


def _possession(rng: random.Random) -> tuple[str, str]:
    (who_zh, who_en), (number_zh, number_en) = rng.choice(PEOPLE), rng.choice(NUMBERS)
    counted_zh, counted_en = rng.choice(COUNTED)
    english = f"{_capitalized(who_en)} has {number_en} {counted_en}."
    return f"{who_zh}有{number_zh}{counted_zh}。", english


SENTENCE_KINDS = [_daily_routine, _description, _possession]


def bilingual_lesson(rng: random.Random) -> str:
    """One document of 6-14 sentence pairs, laid out either line by line ("中文 English") or as
    a Chinese paragraph followed by its English translation."""
    pairs = [rng.choice(SENTENCE_KINDS)(rng) for _ in range(rng.randint(6, 14))]
    if rng.random() < 0.5:
        return "\n".join(f"{chinese} {english}" for chinese, english in pairs)
    return "".join(chinese for chinese, _ in pairs) + "\n\n" + " ".join(e for _, e in pairs)
