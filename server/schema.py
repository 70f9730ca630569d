"""What a request may contain, checked before any work: OpenAI's fields, ours, nothing else.

Every failure becomes `InvalidRequest`, which the app answers with HTTP 400 in OpenAI's error
shape `{"error": {"message", "type", "param", "code"}}`. Unknown fields are refused (as OpenAI
does) rather than silently ignored: a misspelt `temprature` would otherwise sample at the
default temperature without a word.

OpenAI's fields that this server does not implement (penalties, tools, logprobs, ...) are
accepted with a value that asks for nothing, and refused with any other value, naming the
field, so a client never believes it got what it did not:

    "frequency_penalty": 0     -> accepted (the default: no penalty)
    "frequency_penalty": 0.5   -> 400, param "frequency_penalty", code "unsupported_parameter"
    "tools": []                -> accepted;   "tools": [{...}] -> 400, param "tools"
    "metadata": {"k": "v"}     -> accepted (bookkeeping: nothing is stored here anyway)
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

MAX_BODY_BYTES = 1 << 20
"""Requests larger than this are refused (413) before they are parsed."""


class InvalidRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "yes" is not a boolean


class TextPart(_Strict):
    """One element of a content array, `{"type": "text", "text": "..."}`: text only."""
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    """`developer` is OpenAI's newer name for `system` and is treated as one."""
    content: str | list[TextPart]
    name: str | None = None
    """Accepted and ignored: the chat template has no speaker names."""

    def as_turn(self) -> dict[str, str]:
        """{"role", "content"} for the chat template: one text; developer becomes system."""
        text = (self.content if isinstance(self.content, str)
                else "".join(part.text for part in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send one more chunk with the token counts before `data: [DONE]`."""


def no_op(*values: Any) -> set[str]:
    """The values of an unimplemented field that ask for nothing (absent/null included), as
    JSON text so that 0 and false stay different."""
    return {json.dumps(value) for value in (None, *values)}


BOOKKEEPING_FIELDS = {"user": str, "metadata": dict, "store": bool, "safety_identifier": str,
                      "prompt_cache_key": str, "parallel_tool_calls": bool}
"""OpenAI's fields about logging, caching and tools-in-parallel: any value of the right type
is accepted and changes nothing here."""
SHARED_NO_OP_FIELDS = {"frequency_penalty": no_op(0, 0.0), "presence_penalty": no_op(0, 0.0),
                       "logit_bias": no_op({}), "service_tier": no_op("auto", "default")}


class SamplingRequest(_Strict):
    """The fields both endpoints share."""
    NO_OP_FIELDS: ClassVar[dict[str, set[str]]] = SHARED_NO_OP_FIELDS
    """Unimplemented field -> its accepted values (see the module docstring)."""

    model: str | None = None
    """The served model's name (checked by the app); absent = the served model."""
    max_tokens: int | None = Field(None, ge=1)
    """New tokens at most; default: what fits in the context after the prompt."""
    max_completion_tokens: int | None = Field(None, ge=1)
    """OpenAI's newer name for max_tokens."""
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    """0 = greedy (OpenAI's default is 1); a tiny one samples greedily too, never NaN (NaN
    and Infinity, which Python's JSON reader accepts, are refused as not finite)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1)
    """Our extension: sample among the k most likely tokens."""
    stop: str | list[str] | None = Field(None, validate_default=True)
    """Up to 4 strings that end the reply (not included in it); a list once validated."""
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1

    @model_validator(mode="before")
    @classmethod
    def _drop_unimplemented_fields(cls, payload: Any) -> Any:
        """Remove OpenAI's unimplemented fields whose value asks for nothing; refuse the rest
        naming the field (InvalidRequest is not caught by pydantic: it reaches the app)."""
        if not isinstance(payload, dict):
            return payload
        for name, expected in BOOKKEEPING_FIELDS.items():
            if payload.get(name) is not None and not isinstance(payload[name], expected):
                raise InvalidRequest(f"{name}: expected a {expected.__name__}", name)
        for name, accepted in cls.NO_OP_FIELDS.items():
            if name in payload and json.dumps(payload[name]) not in accepted:
                choices = " or ".join(sorted(accepted - {"null"})) or "null"
                raise InvalidRequest(
                    f"{name}: not supported by this server; leave it out or send {choices} "
                    f"(got {json.dumps(payload[name])[:80]})", name, code="unsupported_parameter")
        ignored = cls.NO_OP_FIELDS.keys() | BOOKKEEPING_FIELDS.keys()
        return {key: value for key, value in payload.items() if key not in ignored}

    @field_validator("stop")
    @classmethod
    def _at_most_four_nonempty(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop must be a non-empty string or a list of at most 4 of them")
        return stops

    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatCompletionRequest(SamplingRequest):
    NO_OP_FIELDS = {**SHARED_NO_OP_FIELDS,
                    "logprobs": no_op(False), "top_logprobs": no_op(0),
                    "tools": no_op([]), "tool_choice": no_op("none", "auto"),
                    "functions": no_op([]), "function_call": no_op("none", "auto"),
                    "response_format": no_op({"type": "text"}), "modalities": no_op(["text"]),
                    "audio": no_op(), "prediction": no_op(), "web_search_options": no_op(),
                    "reasoning_effort": no_op(), "verbosity": no_op()}
    messages: list[ChatMessage] = Field(min_length=1)

    def turns(self) -> list[dict[str, str]]:
        return [message.as_turn() for message in self.messages]


class CompletionRequest(SamplingRequest):
    NO_OP_FIELDS = {**SHARED_NO_OP_FIELDS, "logprobs": no_op(0), "best_of": no_op(1),
                    "echo": no_op(False), "suffix": no_op("")}
    prompt: str


def parse_request(body: bytes, model: type[SamplingRequest]) -> SamplingRequest:
    """Bytes of an HTTP body -> a validated request, or InvalidRequest saying what is wrong."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise InvalidRequest(f"the request body is not UTF-8 (byte {error.start}: "
                             f"{error.reason})") from None
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"the request body is not valid JSON ({error.msg} at line "
                             f"{error.lineno} column {error.colno})") from None
    except (RecursionError, ValueError):  # nested thousands deep; an integer of 5000 digits
        raise InvalidRequest("the request body is nested too deeply or holds an integer with "
                             "too many digits") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:  # JSON escapes can spell a lone UTF-16 surrogate ("\\ud800"), which is not text
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest("the request contains an unpaired UTF-16 surrogate escape "
                             "(e.g. \\ud800), which is not a character") from None
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"{param}: {message}" if param else message, param) from None
