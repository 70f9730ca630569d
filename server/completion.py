"""One request's generation seen from the event loop: engine events -> text pieces.

The engine thread delivers token ids; `Generation.pieces()` turns them into text deltas
(`TextStream`), counts the tokens for `usage`, and ends with the finish reason. Whatever ends
the iteration (the response is complete, a stop string was found, the client disconnected and
the task was cancelled), `finally` cancels the engine request, so a row is never decoded for
nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from server.engine import Engine, Event, Finished, GenerationRequest, SamplingParams
from server.text_stream import TextStream
from utils.tokenizer_protocol import Tokenizer


class GenerationFailed(Exception):
    """The engine could not run the request (its message says why)."""


@dataclass
class Piece:
    text: str
    finish_reason: str | None = None
    """Set on the last piece only: "stop" (stop token or stop string) or "length"."""


class Generation:
    def __init__(self, engine: Engine, tokenizer: Tokenizer, prompt_ids: list[int],
                 stop_ids: list[int], max_new_tokens: int, sampling: SamplingParams,
                 stop_strings: list[str]) -> None:
        self.engine, self.stop_ids = engine, stop_ids
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        """Tokens generated so far, counting the stop token when the model produced it."""
        self.text = TextStream(tokenizer, stop_strings)
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.request = GenerationRequest(
            prompt_ids, max_new_tokens, stop_ids, sampling,
            deliver=lambda event: loop.call_soon_threadsafe(self.events.put_nowait, event))

    def submit(self) -> None:
        """Queue the request (raises `EngineBusy` when the queue is full)."""
        self.engine.submit(self.request)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    async def pieces(self) -> AsyncIterator[Piece]:
        try:
            while True:
                event = await self.events.get()
                if isinstance(event, Finished):
                    if event.reason == "error":
                        raise GenerationFailed(event.message)
                    yield Piece(self.text.finish(), event.reason)
                    return
                self.completion_tokens += 1
                if event in self.stop_ids:
                    continue
                delta = self.text.push(event)
                if self.text.stopped:
                    yield Piece(delta, "stop")
                    return
                if delta:
                    yield Piece(delta)
        finally:
            self.request.cancel()

    async def complete(self) -> tuple[str, str]:
        """(the whole text, finish reason) without streaming."""
        parts, finish_reason = [], "length"
        async for piece in self.pieces():
            parts.append(piece.text)
            finish_reason = piece.finish_reason or finish_reason
        return "".join(parts), finish_reason
