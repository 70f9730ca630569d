"""The HTTP layer: OpenAI-compatible routes over one `Engine`, and the chat page.

    POST /v1/chat/completions   messages -> ChatML ids (`utils.conversation`)
    POST /v1/completions        prompt -> its own ids (as generate.py: nothing prepended)
    both stop at <|im_end|> or <|endoftext|> (`utils.conversation.stop_ids`, as generate.py)
    GET  /v1/models             the one served model
    GET  /health                liveness and the engine's queue sizes
    GET  /                      the chat page (server/static/chat.html, self-contained)

With `stream: true` the answer is server-sent events: `data: {chunk}` lines, the last one
`data: [DONE]`. Every failure is answered in OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}` and the server goes on serving; if the
engine thread dies, requests get 500 and `/health` 503 (status "unhealthy").

A browser on the user's machine can be made to send requests to a loopback server by any web
page (DNS rebinding, cross-site POSTs), so `allowed_hosts` (the loopback names, when serving on
loopback) is checked against the Host header, and a request with an Origin header must come
from the server's own origin.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from server.completion import Generation, GenerationFailed
from server.engine import Engine, EngineBusy, EngineFailed, SamplingParams
from server.schema import (
    MAX_BODY_BYTES,
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
    SamplingRequest,
    parse_request,
)
from utils.conversation import build_generation_prompt, stop_ids
from utils.tokenizer_protocol import Tokenizer

CHAT_PAGE = Path(__file__).parent / "static" / "chat.html"


def error_body(message: str, error_type: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(status: int, message: str, error_type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, error_type, param, code), status_code=status)


@dataclass
class ServedModel:
    """What the routes need to know about the model besides the engine."""
    name: str
    tokenizer: Tokenizer
    context_length: int

    def chat_prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        try:
            return build_generation_prompt(self.tokenizer, request.turns())
        except ValueError as error:  # a misplaced system message; text that is not Unicode
            raise InvalidRequest(f"messages: {error}", "messages") from None

    def completion_prompt_ids(self, request: CompletionRequest) -> list[int]:
        try:
            return self.tokenizer.encode(request.prompt) or [self.tokenizer.eos_token_id]
        except ValueError as error:
            raise InvalidRequest(f"prompt: {error}", "prompt") from None

    def token_budget(self, request: SamplingRequest, prompt_tokens: int, prompt_field: str
                     ) -> int:
        """New tokens to generate: max_tokens, or all the room the context leaves."""
        room = self.context_length - prompt_tokens
        wanted = request.token_budget()
        if room < 1 or (wanted is not None and wanted > room):
            raise InvalidRequest(
                f"the prompt has {prompt_tokens} tokens and the model's context is "
                f"{self.context_length}, so at most {max(room, 0)} new tokens fit "
                f"(asked: {wanted or 'at least 1'}); shorten the conversation or max_tokens",
                prompt_field if room < 1 else "max_tokens", code="context_length_exceeded")
        return room if wanted is None else wanted


async def read_body(request: Request) -> bytes:
    """The request body, refused with 413 as soon as it exceeds MAX_BODY_BYTES."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise InvalidRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes",
                             status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise InvalidRequest(f"the request body is larger than {MAX_BODY_BYTES} bytes",
                                 status=413)
        chunks.append(chunk)
    return b"".join(chunks)


def sampling_params(request: SamplingRequest) -> SamplingParams:
    return SamplingParams(temperature=request.temperature, top_k=request.top_k,
                          top_p=request.top_p if request.top_p < 1.0 else None,
                          seed=request.seed)


def _choice(text: str | None, finish_reason: str | None, chat: bool, streaming: bool
            ) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if not chat:
        return {**choice, "text": text or ""}
    if streaming:
        return {**choice, "delta": {} if text is None else {"content": text}}
    return {**choice, "message": {"role": "assistant", "content": text}}


async def _event_stream(generation: Generation, header: dict[str, Any], chat: bool,
                        include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: content chunks, a chunk with the finish reason, usage, [DONE]."""
    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {json.dumps({**header, 'choices': choices, **extra})}\n\n"

    if chat:  # OpenAI's first chunk announces the role
        yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None, "logprobs": None}])
    try:
        async for piece in generation.pieces():
            if piece.text:
                yield event([_choice(piece.text, None, chat, streaming=True)])
            if piece.finish_reason:
                yield event([_choice(None, piece.finish_reason, chat, streaming=True)])
    except Exception as error:  # the status line is sent: say it in the stream, then end it
        message = (str(error) if isinstance(error, GenerationFailed)
                   else f"internal error: {type(error).__name__}: {error}")
        yield f"data: {json.dumps(error_body(message, 'server_error'))}\n\n"
    else:
        if include_usage:
            yield event([], usage=generation.usage())
    yield "data: [DONE]\n\n"


async def _until_done_or_disconnected(task: asyncio.Task, http_request: Request) -> None:
    """Wait for `task`; cancel it if the client goes away first (its row is then freed)."""
    while not task.done():
        await asyncio.wait([task], timeout=0.1)
        if not task.done() and await http_request.is_disconnected():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return


def origin_problem(headers: Any, allowed_hosts: set[str] | None) -> str:
    """'' if the Host and Origin headers are acceptable, else why not (see the docstring)."""
    host = headers.get("host", "")
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or "]:" in host else host
    if allowed_hosts is not None and name not in allowed_hosts:
        return f"Host {host!r} is not this server (expected one of {sorted(allowed_hosts)})"
    origin = headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1] != host:
        return f"cross-origin requests are refused (Origin {origin!r}, Host {host!r})"
    return ""


class HostAndOriginCheck:
    """ASGI middleware answering 403 when `origin_problem` finds one (a plain ASGI class, not
    `@app.middleware`, which would hide a client's disconnect from the routes)."""

    def __init__(self, app: Any, allowed_hosts: set[str] | None) -> None:
        self.app, self.allowed_hosts = app, allowed_hosts

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            problem = origin_problem(Headers(scope=scope), self.allowed_hosts)
            if problem:
                response = error_response(403, problem, code="forbidden_origin")
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


async def respond(engine: Engine, served: ServedModel, http_request: Request,
                  request: SamplingRequest, prompt_ids: list[int], chat: bool) -> Response:
    """One completion for `request`: streamed as server-sent events, or whole as JSON (499
    when the client left before it was done)."""
    if request.model not in (None, served.name):
        raise InvalidRequest(f"model: {request.model!r} is not served here; this server "
                             f"serves {served.name!r} (GET /v1/models)", "model",
                             status=404, code="model_not_found")
    budget = served.token_budget(request, len(prompt_ids), "messages" if chat else "prompt")
    generation = Generation(engine, served.tokenizer, prompt_ids,
                            stop_ids(served.tokenizer), budget, sampling_params(request),
                            request.stop)
    generation.submit()
    header = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
              "object": "chat.completion" if chat else "text_completion",
              "created": int(time.time()), "model": served.name}
    if request.stream:
        if chat:
            header["object"] = "chat.completion.chunk"
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        return StreamingResponse(
            _event_stream(generation, header, chat, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    completing = asyncio.create_task(generation.complete())
    await _until_done_or_disconnected(completing, http_request)
    if completing.cancelled():
        return Response(status_code=499)  # nobody reads it: the client has left
    try:
        text, finish_reason = completing.result()
    except GenerationFailed as error:
        return error_response(500, str(error), "server_error")
    return JSONResponse({**header, "choices": [_choice(text, finish_reason, chat, False)],
                         "usage": generation.usage()})


def add_error_handlers(app: FastAPI) -> None:
    """Every failure answered in OpenAI's error shape (module docstring)."""

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: Request, error: InvalidRequest) -> JSONResponse:
        error_type = "authentication_error" if error.status == 401 else "invalid_request_error"
        return error_response(error.status, error.message, error_type, error.param, error.code)

    @app.exception_handler(EngineBusy)
    async def busy(_: Request, error: EngineBusy) -> JSONResponse:
        response = error_response(503, str(error), "server_overloaded")
        response.headers["Retry-After"] = "1"
        return response

    @app.exception_handler(EngineFailed)
    async def engine_failed(_: Request, error: EngineFailed) -> JSONResponse:
        return error_response(500, str(error), "server_error")

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(error).__name__}: {error}",
                              "server_error")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail))


def create_app(engine: Engine, served: ServedModel, api_key: str | None = None,
               allowed_hosts: set[str] | None = None) -> FastAPI:
    """The FastAPI app; it starts the engine's thread on startup and stops it on shutdown.
    `allowed_hosts`: the Host header's accepted names (None: any)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        engine.stop()

    app = FastAPI(title="z2all", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # no schema page: it would bypass the API key
    app.add_middleware(HostAndOriginCheck, allowed_hosts=allowed_hosts)

    chat_page = CHAT_PAGE.read_text(encoding="utf-8")

    def check_api_key(request: Request) -> None:
        expected = f"Bearer {api_key}".encode()
        given = request.headers.get("authorization", "").encode()
        if api_key and not hmac.compare_digest(given, expected):
            raise InvalidRequest("missing or wrong API key: send 'Authorization: Bearer <key>' "
                                 "with the key the server was started with", status=401,
                                 code="invalid_api_key")

    api = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])

    @api.post("/chat/completions")
    async def chat_completions(http_request: Request) -> Response:
        request = parse_request(await read_body(http_request), ChatCompletionRequest)
        prompt_ids = await asyncio.to_thread(served.chat_prompt_ids, request)  # maybe 1 MiB
        return await respond(engine, served, http_request, request, prompt_ids, chat=True)

    @api.post("/completions")
    async def completions(http_request: Request) -> Response:
        request = parse_request(await read_body(http_request), CompletionRequest)
        prompt_ids = await asyncio.to_thread(served.completion_prompt_ids, request)
        return await respond(engine, served, http_request, request, prompt_ids, chat=False)

    @api.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served.name, "object": "model",
                                            "created": 0, "owned_by": "z2all",
                                            "context_length": served.context_length}]}

    app.include_router(api)

    @app.get("/health")
    async def health() -> JSONResponse:
        stats = engine.stats()
        return JSONResponse({"status": "ok" if stats["healthy"] else "unhealthy",
                             "model": served.name, "context_length": served.context_length,
                             **stats},
                            status_code=200 if stats["healthy"] else 503)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return chat_page

    add_error_handlers(app)
    return app
