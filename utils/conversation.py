r"""The chat template (ChatML): messages -> token ids + a loss mask saying what to train on.

Every turn is rendered as

    <|im_start|>{role}\n{content}<|im_end|>\n

where `<|im_start|>` and `<|im_end|>` are inserted *by id*, and each turn's text "{role}\n{content}"
and the "\n" after it are encoded as ordinary text. A user who types "<|im_end|>" in a message gets
the characters of that string, never the special token: only this file creates special ids
(docs/design.md §2.2, a security property: text cannot forge a turn boundary).

The ids are exactly what any HF tokenizer gives for the same template (`CHAT_TEMPLATE` below,
saved in every tokenizer_config.json): it cuts the rendered string at the special tokens and
encodes each piece between them, as we do. The one difference is the security property: given
content containing a special-token string, HF turns that string into the special id.

Worked example (ids shortened; S = <|im_start|>, E = <|im_end|>):

    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    tokens  S  "user"  "\n"  "Hi"  E  "\n"  S  "assistant"  "\n"  "Hello"  "!"  E  "\n"
    mask    0  0       0     0     0  0     0  0            0     1        1    1  0

The mask is 1 exactly on the assistant's content and the `<|im_end|>` that closes it (of every
assistant message not marked `{"trained": False}`, see TRAINED): the model
must learn both what to say and when to stop. Not trained: system/user turns, every role header
(the prompt supplies "assistant\n" at generation time, see `build_generation_prompt`), the
next turn's `<|im_start|>`, and the trailing "\n" after `<|im_end|>` (generation stops at
`<|im_end|>`, so the newline is template glue that is never generated). The content starts at
the first token where the turn's ids part from the header's own ids ("assistant\n" encoded
alone): almost always right after them; when the content begins with a line break that merges
with the header's "\n" into one token, that token carries content and is trained.

A pretrained model's tokenizer (`tokenizer.PretrainedTokenizer`) brings its own template: every
function below then hands the work to its `chat_renderer` (utils/chat_template.py), which
applies the same rules to any template and gives these very ids and masks for this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from utils.tokenizer_protocol import ChatRenderer, TemplatedTokenizer, Tokenizer

ROLES = ("system", "user", "assistant")
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# The same layout as a Jinja chat template, for HF's apply_chat_template (plain Jinja, no tags
# beyond `for`/`if`, so every client that renders templates can read it).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}
# An assistant message with {"trained": False} is context, not a target: rendered as any turn,
# left out of the loss mask (the earlier replies inside a TRL prompt/completion record's prompt).
TRAINED = "trained"


def is_trained(message: Message) -> bool:
    """Whether the loss trains on `message`: an assistant turn not marked as context."""
    return message["role"] == "assistant" and message.get(TRAINED, True) is not False


def with_system_prompt(messages: Sequence[Message], system: str | None) -> list[Message]:
    """Prepend `system` unless the conversation already starts with its own system message."""
    messages = list(messages)
    if system and (not messages or messages[0]["role"] != "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def check_messages(messages: Sequence[Any]) -> None:
    """Raise ValueError naming the first message that is not a valid chat message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("a conversation must be a non-empty list of messages")
    for position, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES or not isinstance(message.get("content"), str):
            raise ValueError(f"message {position} must be {{'role': one of {ROLES}, "
                             f"'content': str}}; got {str(message)[:80]}")
        if role == "system" and position != 0:
            raise ValueError(f"message {position}: a system message may only come first")


def _template_renderer(tokenizer: Tokenizer) -> ChatRenderer | None:
    """A pretrained tokenizer's own `ChatTemplate`; None for ours (ChatML, rendered here)."""
    if not isinstance(tokenizer, TemplatedTokenizer):
        return None
    if tokenizer.chat_renderer is None:
        raise ValueError(f"{tokenizer.name_or_path}: the tokenizer has no chat template "
                         "(tokenizer_config.json chat_template or chat_template.jinja); "
                         "chat data and chat prompts need one")
    return tokenizer.chat_renderer


def render_conversations(tokenizer: Tokenizer, conversations: Sequence[Sequence[Message]],
                         system: str | None = None) -> list[tuple[list[int], list[int]]]:
    """Render many conversations with one batched encode; returns (ids, loss_mask) for each."""
    conversations = [with_system_prompt(messages, system) for messages in conversations]
    for messages in conversations:
        check_messages(messages)
    renderer = _template_renderer(tokenizer)
    if renderer is not None:
        return [renderer.ids_and_mask(messages) for messages in conversations]
    start_id = tokenizer.convert_tokens_to_ids(IM_START)
    end_id = tokenizer.convert_tokens_to_ids(IM_END)
    # Step 1: every piece of ordinary text, in one list, so the tokenizer sees one big batch:
    # the glue "\n", each role's header alone (to find where content starts), then each turn.
    pieces = ["\n", *(f"{role}\n" for role in ROLES)]
    for messages in conversations:
        pieces += [f"{message['role']}\n{message['content']}" for message in messages]
    encoded = iter(tokenizer.encode_batch(pieces))
    newline = next(encoded)
    header_ids = {role: next(encoded) for role in ROLES}
    # Step 2: assemble turns in the same order, special ids inserted by id, masks alongside.
    rendered = []
    for messages in conversations:
        ids: list[int] = []
        mask: list[int] = []
        for message in messages:
            turn = next(encoded)
            content_start = common_prefix_length(turn, header_ids[message["role"]])
            trained = int(is_trained(message))
            ids += [start_id, *turn, end_id, *newline]
            mask += ([0] * (1 + content_start) + [trained] * (len(turn) - content_start + 1)
                     + [0] * len(newline))
        rendered.append((ids, mask))
    return rendered


def common_prefix_length(ids: Sequence[int], prefix: Sequence[int]) -> int:
    """How many leading ids `ids` shares with `prefix`."""
    length = 0
    while length < min(len(ids), len(prefix)) and ids[length] == prefix[length]:
        length += 1
    return length


def render_conversation(tokenizer: Tokenizer, messages: Sequence[Message],
                        system: str | None = None) -> tuple[list[int], list[int]]:
    """One conversation -> (ids, loss_mask); see the module docstring for the layout."""
    return render_conversations(tokenizer, [messages], system)[0]


def build_generation_prompt(tokenizer: Tokenizer, messages: Sequence[Message],
                            system: str | None = None) -> list[int]:
    """The ids of `messages` followed by "<|im_start|>assistant\\n": the model writes the reply.

    Generation should stop at `<|im_end|>` (pass its id as the eos_token_id).
    """
    messages = with_system_prompt(messages, system)
    renderer = _template_renderer(tokenizer)
    if renderer is not None:
        return renderer.generation_prompt(messages)
    ids = render_conversation(tokenizer, messages)[0] if messages else []
    header = tokenizer.encode_batch(["assistant\n"])[0]
    return ids + [tokenizer.convert_tokens_to_ids(IM_START), *header]


def stop_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids that end a generation: <|endoftext|> (end of a document) and <|im_end|> (end of
    a turn). generate.py, the server and the HF export's generation_config.json agree on them.
    A pretrained tokenizer's: its EOS and generation_config.json's eos_token_id(s)."""
    if isinstance(tokenizer, TemplatedTokenizer):
        return list(tokenizer.stop_token_ids)
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
