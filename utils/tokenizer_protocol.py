"""What z2all's code asks of a tokenizer: a `Protocol`, so that code below tokenizer/ (the chat
rendering here in utils/) and above it (data, trainer, server, tools) names one type.

Two classes answer it, both in tokenizer/: ours (`Z2allTokenizer`, z2all_tokenizer.py), whose
chats are ChatML rendered by utils/conversation.py, and a pretrained model's
(`PretrainedTokenizer`, pretrained_tokenizer.py), which brings its own chat template and stop ids:
it is also a `TemplatedTokenizer`, and `isinstance(tokenizer, TemplatedTokenizer)` is how the
chat code tells the two apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class ChatRenderer(Protocol):
    """A chat template turned into ids (utils/chat_template.py's `ChatTemplate`)."""

    def ids_and_mask(self, messages: Sequence[Any]) -> tuple[list[int], list[int]]:
        """A conversation's ids and its loss mask (1 on the assistant's trained tokens)."""
        ...

    def generation_prompt(self, messages: Sequence[Any]) -> list[int]:
        """The ids of `messages` followed by the header the assistant's reply starts after."""
        ...


class Tokenizer(Protocol):
    """Text <-> token ids, special-token strings in text kept as text (tokenizer/text_only.py)."""

    name_or_path: str
    fingerprint: str
    """A hash of what decides the ids of a text (tokenizer.json, and a template's text)."""
    eos_token_id: int
    pad_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids as ordinary text (no post-processor), in one batched call."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def convert_tokens_to_ids(self, token: str) -> int: ...

    def save_pretrained(self, save_directory: str | Path) -> tuple[str, ...]: ...


@runtime_checkable
class TemplatedTokenizer(Protocol):
    """A pretrained model's tokenizer: its own chat template and the ids that end a reply."""

    chat_renderer: ChatRenderer | None
    """None: the model has no chat template (chat data and chat prompts are then refused)."""
    stop_token_ids: list[int]
