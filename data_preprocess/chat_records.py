"""SFT and DPO records in their many shapes (docs/design.md §2.1) -> plain chat messages.

Everything downstream (utils/conversation.py, the datasets) sees one shape only:
`[{"role": "system" | "user" | "assistant", "content": str}, ...]`.

SFT record shapes:
    ShareGPT  {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", ...}]}
    OpenAI    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", ...}]}
    Alpaca    {"instruction": "Translate", "input": "chat", "output": "cat"}
              -> user "Translate\\n\\nchat" (just "Translate" when input is empty), assistant "cat"
    TRL prompt/completion, plain or conversational:
              {"prompt": "Hi", "completion": "Hello"}  -> user "Hi", assistant "Hello"
              {"prompt": [messages], "completion": [assistant messages]}
              -> the prompt's messages, then the completion's; only the completion is trained
                 (an assistant turn inside the prompt is context: {"trained": False}, which
                 utils/conversation.py leaves out of the loss mask), as TRL's SFTTrainer does
DPO record shapes (prompt and two responses; a response becomes the assistant's reply):
    {"conversations": [...ending with a user turn], "chosen": {"from": "gpt", "value": ".."},
     "rejected": {...}}
    {"prompt": "..." or [messages], "chosen": "..." or [assistant messages], "rejected": ...}

A record that fits none of these raises `RecordFormatError` with a short reason slug; the
caller adds the file and line number (or skips and counts it with --skip_bad_records).
"""

from __future__ import annotations

from typing import Any

from utils.conversation import TRAINED, Message, check_messages

ROLE_ALIASES = {"system": "system", "human": "user", "user": "user",
                "gpt": "assistant", "assistant": "assistant", "bot": "assistant"}


class RecordFormatError(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def to_message(raw: Any) -> Message:
    """A ShareGPT `{"from", "value"}` or OpenAI `{"role", "content"}` dict -> a Message."""
    if isinstance(raw, dict) and "from" in raw:
        role, content = raw["from"], raw.get("value")
    elif isinstance(raw, dict):
        role, content = raw.get("role"), raw.get("content")
    else:
        raise RecordFormatError("bad_message", f"a message must be an object; got {raw!r:.80}")
    if role not in ROLE_ALIASES or not isinstance(content, str):
        raise RecordFormatError("bad_message", f"unknown role or non-text content in {raw!r:.80}")
    return {"role": ROLE_ALIASES[role], "content": content}


def to_messages(raw: Any, what: str) -> list[Message]:
    if not isinstance(raw, list):
        raise RecordFormatError("bad_message", f"{what} must be a list of messages")
    messages = [to_message(item) for item in raw]
    try:
        check_messages(messages)
    except ValueError as error:
        raise RecordFormatError("bad_message", f"{what}: {error}") from None
    return messages


def check_turn_order(messages: list[Message], what: str) -> None:
    """After an optional system message, turns alternate user, assistant, user, ...: a
    conversation that starts with the assistant or repeats a role is a broken record."""
    first_turn = 1 if messages[0]["role"] == "system" else 0
    for position in range(first_turn, len(messages)):
        expected = ("user", "assistant")[(position - first_turn) % 2]
        if messages[position]["role"] != expected:
            raise RecordFormatError("bad_turn_order", f"{what}: message {position} is "
                                    f"{messages[position]['role']!r}, expected {expected!r} "
                                    "(turns alternate user/assistant, starting with user)")


def prompt_messages(raw: Any) -> list[Message]:
    """A prompt (of a DPO or TRL prompt/completion record): a string is the user's turn."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return to_messages(raw, "prompt")


def prompt_completion_messages(data: dict[str, Any]) -> list[Message]:
    """TRL's prompt/completion record -> the conversation, the prompt's assistant turns (if
    any) marked as context, so only the completion is trained."""
    context = [{**message, TRAINED: False} if message["role"] == "assistant" else message
               for message in prompt_messages(data["prompt"])]
    return context + response_messages(data["completion"], "completion")


def sft_messages(data: dict[str, Any]) -> list[Message]:
    """One SFT record (any supported shape) -> its conversation."""
    if "prompt" in data and "completion" in data:
        messages = prompt_completion_messages(data)
    elif "conversations" in data:
        messages = to_messages(data["conversations"], "conversations")
    elif "messages" in data:
        messages = to_messages(data["messages"], "messages")
    elif "instruction" in data and "output" in data:
        instruction, extra, output = data["instruction"], data.get("input") or "", data["output"]
        if not all(isinstance(value, str) for value in (instruction, extra, output)):
            raise RecordFormatError("bad_message", "instruction/input/output must be strings")
        system = data.get("system")
        messages = ([{"role": "system", "content": system}] if isinstance(system, str) else [])
        messages += [{"role": "user", "content": f"{instruction}\n\n{extra}" if extra
                      else instruction},
                     {"role": "assistant", "content": output}]
    else:
        raise RecordFormatError("unknown_format", "expected 'conversations', 'messages', "
                                "'instruction'+'output' or 'prompt'+'completion'; record has "
                                f"{sorted(data)[:8]}")
    check_turn_order(messages, "conversation")
    if not any(message["role"] == "assistant" for message in messages):
        raise RecordFormatError("no_assistant_turn", "nothing to train on: no assistant message")
    return messages


def response_messages(raw: Any, what: str) -> list[Message]:
    """A DPO response: a string, one message, or a list of assistant messages."""
    if isinstance(raw, str):
        return [{"role": "assistant", "content": raw}]
    messages = to_messages(raw if isinstance(raw, list) else [raw], what)
    if any(message["role"] != "assistant" for message in messages):
        raise RecordFormatError("bad_message", f"{what} must hold only assistant messages")
    return messages


def dpo_messages(data: dict[str, Any]) -> tuple[list[Message], list[Message], list[Message]]:
    """One DPO record -> (prompt, chosen reply, rejected reply) as message lists."""
    if "chosen" not in data or "rejected" not in data:
        raise RecordFormatError("unknown_format", "a DPO record needs 'chosen' and 'rejected'")
    if "conversations" in data:
        prompt = to_messages(data["conversations"], "conversations")
    elif "prompt" in data:
        prompt = prompt_messages(data["prompt"])
    else:
        raise RecordFormatError("unknown_format", "a DPO record needs 'conversations' or 'prompt'")
    check_turn_order(prompt, "prompt")
    if prompt[-1]["role"] != "user":
        raise RecordFormatError("bad_message", "the DPO prompt must end with a user message")
    return (prompt, response_messages(data["chosen"], "chosen"),
            response_messages(data["rejected"], "rejected"))
