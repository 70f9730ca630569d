"""Long documents reach a tokenizer trainer in bounded pieces.

Trainers hold a whole training text at once while they split it into words: a 50 MB
single-line document made the byte-level BPE trainer peak at ~5 GB. sentencepiece skips any
sentence longer than its `max_sentence_length` outright. Cutting a long text at line ends
changes only the few words that straddle a cut, and keeps memory proportional to the piece.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def bounded_pieces(texts: Iterable[str], max_bytes: int) -> Iterator[str]:
    """Each text whole, or cut into consecutive pieces of <= max_bytes UTF-8 bytes, at line
    ends where possible (a longer line is cut every max_bytes // 4 characters)."""
    max_chars = max_bytes // 4  # a character is at most 4 UTF-8 bytes
    for text in texts:
        if len(text) <= max_chars or len(text.encode("utf-8")) <= max_bytes:
            yield text
            continue
        chunk: list[str] = []
        chunk_bytes = 0
        for line in text.splitlines(keepends=True):
            for start in range(0, len(line), max_chars):
                piece = line[start:start + max_chars]
                piece_bytes = len(piece.encode("utf-8"))
                if chunk and chunk_bytes + piece_bytes > max_bytes:
                    yield "".join(chunk)
                    chunk, chunk_bytes = [], 0
                chunk.append(piece)
                chunk_bytes += piece_bytes
        if chunk:
            yield "".join(chunk)
