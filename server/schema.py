"""What a request may contain, checked before any work: OpenAI's fields, ours, nothing else.

Every failure becomes `InvalidRequest`, which the app answers with HTTP 400 in OpenAI's error
shape `{"error": {"message", "type", "param", "code"}}`. Unknown fields are refused (as OpenAI
does) rather than silently ignored: a misspelt `temprature` would otherwise sample at the
default temperature without a word.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_BODY_BYTES = 1 << 20
"""Requests larger than this are refused (413) before they are parsed."""


class InvalidRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "yes" is not a boolean


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send one more chunk with the token counts before `data: [DONE]`."""


class SamplingRequest(_Strict):
    """The fields both endpoints share."""
    model: str | None = None
    """Echoed back as the served model's name (the server serves one model)."""
    max_tokens: int | None = Field(None, ge=1)
    """New tokens at most; default: what fits in the context after the prompt."""
    max_completion_tokens: int | None = Field(None, ge=1)
    """OpenAI's newer name for max_tokens."""
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    """0 = greedy (OpenAI's default is 1)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    """Our extension: sample among the k most likely tokens."""
    stop: str | list[str] | None = Field(None, validate_default=True)
    """Up to 4 strings that end the reply (not included in it); a list once validated."""
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    user: str | None = None

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
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(SamplingRequest):
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
