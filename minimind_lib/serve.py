"""Serve the model over HTTP, OpenAI-compatible (notebook 08).

``create_app(model, tokenizer)`` returns a FastAPI app with ``POST /generate`` (prompt in, text
out), ``POST /v1/chat/completions`` (plain and streaming server-sent events) and
``GET /v1/models`` (with the model card: parameters, profile, stage), so standard OpenAI clients
can talk to it, and ``GET /``: a chat page (``static/chat.html``, plain HTML and JavaScript that
streams from ``/v1/chat/completions``; nothing loaded from elsewhere, so it works offline). The
text comes from ``minimind_lib.inference.TextStream``, the same stream the terminal chat uses.

Pictures: when the model is a vision-language model (``minimind_lib.vlm``, a ``vision/vlm``
folder: notebook 13), a user message may hold one OpenAI ``image_url`` part whose URL is a
``data:image/...;base64,...`` URL; the picture goes at the start of that message, where the
VLM was trained to see it. A text-only model, a web link, or a second picture is a 400.

Every error, whatever its cause, has OpenAI's shape
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``:

* 400: a bad request. Sampling settings are checked by ``inference.SamplingParams`` (the one
  validator, shared with the library and the CLI) and a bad one is named in ``param``; known
  roles (``developer`` is read as ``system``), text that is valid Unicode, a prompt plus new
  tokens within the model's context, a body that is UTF-8 JSON.
* 401: a server started with an API key (``create_app(api_key=...)``, ``serve --api-key``)
  wants ``Authorization: Bearer <key>``.
* 413: a body over ``max_body_bytes``, or messages with more characters than could fit the
  context (checked before tokenising, which runs off the event loop).
* 503 with ``Retry-After``: ``max_waiting`` requests are already waiting for the model.
* 500: a bug; the traceback goes to the server log, and the connection stays usable.

Concurrency: a model must not run two generations interleaved (the KV caches and the global
RNG would mix), so one worker thread (``Engine``) runs the jobs one after another while the
event loop keeps accepting requests and streaming the finished tokens back. A client that hangs
up (streaming or not) cancels its job, waiting or running.

The request models and handlers live at module level; a handler finds its model, tokenizer
and engine in ``request.app.state.server`` (a ``ServerState``).
"""

# subtle: no ``from __future__ import annotations`` here: FastAPI reads the request models from
# the handlers' annotations, which must be real classes at run time.
import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal

import torch
from torch import nn

try:  # fastapi and uvicorn are the optional "serve" extra
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, field_validator
    from pydantic_core import PydanticCustomError
    from starlette.exceptions import HTTPException
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("minimind_lib.serve needs FastAPI: pip install -e '.[serve]'") from e

from minimind_lib.inference import (
    SamplingError,
    SamplingParams,
    TextStream,
    context_length,
    stop_ids,
)
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.tokenizer import END_OF_TEXT, IM_END, BPETokenizer, encode_chat, text_problem
from minimind_lib.vision import to_pixels
from minimind_lib.vlm import VisionLanguageModel, encode_image_chat, image_from_data_url

DEFAULT_PORT = 8998
API_KEY_ENV = "MINIMIND_API_KEY"  # where ``python -m minimind_lib serve`` finds a key
MAX_BODY_BYTES = 4 << 20  # a full 32k-token context is ~0.5M characters, ~3 MB as \u-escaped JSON
MAX_WAITING = 64  # requests queued behind the running one before 503
RETRY_AFTER_SECONDS = 2
log = logging.getLogger("minimind_lib.serve")

# --------------------------------------------------------------------------- errors


def error_body(message: str, param: str | None = None, type: str = "invalid_request_error",
               code: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An error answered with HTTP ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, *,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, self.code, self.headers = type, code, headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.param, self.type, self.code),
                            status_code=self.status, headers=self.headers)


class BadRequest(APIError):
    """A request that is well-formed but cannot be served (answered with HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, param)


class ServerBusy(APIError):
    """Too many requests already wait for the model (HTTP 503, retry later)."""

    def __init__(self, waiting: int) -> None:
        super().__init__(503, f"the server is busy: {waiting} requests are waiting for the model; "
                              f"retry in {RETRY_AFTER_SECONDS} s", type="server_error",
                         code="server_busy", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class ClientGone(Exception):
    """The client hung up before its job started; nobody reads the answer."""


# --------------------------------------------------------------------------- the worker


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    stop: set[int]
    loop: asyncio.AbstractEventLoop
    pixel_values: torch.Tensor | None = None  # a picture for a VLM (1, 3, H, W)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)

    def emit(self, kind: str, value: object) -> None:  # called from the worker thread
        if self.loop.is_closed():  # the server shut down mid-generation: nobody is listening
            self.cancel.set()
            return
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Engine:
    """Runs generation jobs one at a time on a worker thread; results stream back to asyncio.

    subtle: serialising is what makes concurrent requests *correct*: a greedy answer is
    the same whether it ran alone or among 64 others. At most ``max_waiting`` jobs wait
    (cancelled ones do not count); one more is refused with ``ServerBusy``.
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer,
                 max_waiting: int = MAX_WAITING) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_waiting = max_waiting
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._waiting: list[_Job] = []  # submitted, not yet started
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Jobs queued and not cancelled."""
        with self._lock:
            return sum(not job.cancel.is_set() for job in self._waiting)

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               stop: set[int], pixel_values: torch.Tensor | None = None) -> _Job:
        """Queue a job; read its events with ``events(job)``."""
        waiting = self.waiting
        if waiting >= self.max_waiting:
            raise ServerBusy(waiting)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="minimind-generate",
                                                daemon=True)
                self._thread.start()
            job = _Job(prompt_ids, params, stop, asyncio.get_running_loop(), pixel_values)
            self._waiting.append(job)
        self._jobs.put(job)
        return job

    async def events(self, job: _Job) -> AsyncIterator[tuple[str, object]]:
        """("text", chunk) ... then ("done", TextStream), ("error", exception) or
        ("cancelled", None) for a job cancelled before it started."""
        try:
            while True:
                kind, value = await job.events.get()
                yield kind, value
                if kind != "text":
                    return
        finally:
            job.cancel.set()  # a client that disconnects mid-stream frees the worker

    def close(self) -> None:
        """Stop the worker thread after the queued jobs."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting.remove(job)
            if job.cancel.is_set():
                job.emit("cancelled", None)
                continue
            try:
                stream = TextStream(self.model, self.tokenizer, job.prompt_ids, job.params,
                                    job.stop, cancelled=job.cancel.is_set,
                                    pixel_values=job.pixel_values)
                with torch.inference_mode():
                    for chunk in stream:
                        job.emit("text", chunk)
                job.emit("done", stream)
            except Exception as e:  # reported to the client, the worker lives on
                job.emit("error", e)


async def _cancel_when_gone(request: Request, job: _Job) -> None:
    """Cancel ``job`` once the client hangs up (its request body is read, so the next ASGI
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()


# --------------------------------------------------------------------------- request bodies


def _valid_text(text: str) -> str:
    """``text``, if it has UTF-8 bytes (a JSON ``"\\ud800"`` escape gives a str that has not)."""
    problem = text_problem(text)
    if problem:
        raise PydanticCustomError("invalid_text", problem)
    return text


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ImagePart(BaseModel):
    """OpenAI's picture part; only ``data:`` URLs are read (``vlm.image_from_data_url``)."""

    type: Literal["image_url"]
    image_url: ImageURL


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart | ImagePart]

    @field_validator("content")
    @classmethod
    def _valid_content(cls, content: str | list) -> str | list:
        texts = [content] if isinstance(content, str) else \
            [p.text for p in content if isinstance(p, TextPart)]
        for text in texts:
            _valid_text(text)
        return content

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content if isinstance(p, TextPart))

    def image_urls(self) -> list[str]:
        return [] if isinstance(self.content, str) else \
            [p.image_url.url for p in self.content if isinstance(p, ImagePart)]

    def as_dict(self) -> dict:
        """ChatML's message; OpenAI's ``developer`` role (newer clients' name) is the system."""
        return {"role": "system" if self.role == "developer" else self.role,
                "content": self.text()}


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """OpenAI's chat completion request (the fields this server uses; others are ignored).
    Sampling fields are only typed here: ``SamplingParams`` checks their values."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None


class GenerateRequest(BaseModel):
    """``POST /generate``: one prompt, its text back."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    max_new_tokens: int | None = None
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    chat: bool = True  # wrap the prompt as one user turn in ChatML (for SFT/DPO models)

    _valid_prompt = field_validator("prompt")(_valid_text)


# --------------------------------------------------------------------------- the app


@dataclass
class ServerState:
    """What every handler needs: the engine, the tokenizer, the served model's limits."""

    engine: Engine
    tokenizer: BPETokenizer
    model_name: str
    context: int  # positions the model attends over (prompt + answer)
    default_max_new_tokens: int
    chat_stop: set[int]
    created: int = field(default_factory=lambda: int(time.time()))
    api_key: str | None = None
    #: more characters than this cannot fit the context: no token holds more characters than
    #: the longest token's bytes
    max_prompt_chars: int = 0
    vlm: VisionLanguageModel | None = None  # set when the model reads pictures

    def __post_init__(self) -> None:
        if not self.max_prompt_chars:
            longest = max(len(self.tokenizer.token_bytes(i)) for i in range(len(self.tokenizer)))
            self.max_prompt_chars = self.context * longest

    def check_size(self, texts: list[str], param: str) -> None:
        """413 when ``texts`` cannot fit the context whatever their tokens: too many
        characters, or too many messages (each takes at least 3 tokens)."""
        chars = sum(len(t) for t in texts)
        if chars > self.max_prompt_chars:
            raise APIError(413, f"{param} hold {chars:,} characters; this server takes at most "
                                f"{self.max_prompt_chars:,} (the model's context is "
                                f"{self.context:,} tokens)", param, code="request_too_large")
        if 3 * len(texts) > self.context:
            raise APIError(413, f"{len(texts):,} messages cannot fit the model's context of "
                                f"{self.context:,} tokens (each takes at least 3)", param,
                           code="request_too_large")

    async def encode(self, messages: list[dict] | None = None, text: str | None = None,
                     image_turn: int | None = None) -> list[int]:
        """The prompt's ids: ``messages`` in ChatML with the generation prompt (with a VLM's
        image slots in message ``image_turn``), or raw ``text``. Tokenising takes ~1 s per MB
        of text, so it runs on a thread, not the event loop."""
        if image_turn is not None:
            return await asyncio.to_thread(encode_image_chat, self.tokenizer, messages,
                                           self.vlm.image_tokens, True, image_turn)
        if messages is not None:
            return await asyncio.to_thread(encode_chat, self.tokenizer, messages, True)
        return await asyncio.to_thread(self.tokenizer.encode, text, set())

    def picture(self, messages: list[Message]) -> tuple[torch.Tensor | None, int | None]:
        """The request's picture as pixels (1, 3, H, W) and the message holding it, or
        (None, None). A 400 when the model reads no pictures, when there is more than one,
        when it is not in a user message, or when it is not a readable ``data:`` URL."""
        found = [(i, url) for i, m in enumerate(messages) for url in m.image_urls()]
        if not found:
            return None, None
        if self.vlm is None:
            raise BadRequest("this server's model reads text only; to send pictures, serve a "
                             "vision-language model folder (python -m minimind_lib serve "
                             "--model runs/<profile>/vision/vlm)", "messages")
        (turn, url), param = found[0], f"messages[{found[0][0]}].content"
        if len(found) > 1:
            raise BadRequest(f"{len(found)} pictures; the model reads one per conversation",
                             "messages")
        if messages[turn].role != "user":
            raise BadRequest("a picture goes in a user message", param)
        try:
            image = image_from_data_url(url, self.vlm.encoder.config.image_size)
        except ValueError as e:
            raise BadRequest(str(e), param) from None
        return to_pixels(image), turn

    def sampling(self, max_new: int | None, param: str, **settings: object) -> SamplingParams:
        """The request's ``SamplingParams`` (a bad value is a 400 naming the field);
        ``max_new_tokens`` is settled by ``fit`` once the prompt is known."""
        try:
            return SamplingParams(max_new_tokens=1 if max_new is None else max_new, **settings)
        except SamplingError as e:
            if e.field == "max_new_tokens":
                raise BadRequest(str(e).replace("max_new_tokens", param), param) from None
            raise BadRequest(str(e), e.field) from None

    def fit(self, params: SamplingParams, prompt_ids: list[int], prompt_param: str,
            max_new: int | None, param: str) -> SamplingParams:
        """``params`` with ``max_new_tokens`` checked against the room the prompt leaves (the
        default: what fits, up to ``default_max_new_tokens``)."""
        room = self.context - len(prompt_ids)
        if max_new is None:
            if room < 1:
                raise BadRequest(f"the prompt is {len(prompt_ids)} tokens; the model's context "
                                 f"is {self.context} tokens, leaving no room for an answer",
                                 prompt_param)
            return dataclasses.replace(params, max_new_tokens=min(self.default_max_new_tokens,
                                                                  room))
        if max_new > room:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + {param} ({max_new}) exceeds "
                             f"the model's context of {self.context} tokens", param)
        return params

    async def run(self, request: Request, prompt_ids: list[int], params: SamplingParams,
                  stop: set[int], pixel_values: torch.Tensor | None = None) -> TextStream:
        """Generate to the end on the engine; the finished stream. A client that hangs up
        cancels the job (then the stream's ``finish_reason`` is "cancelled", or ``ClientGone``
        when it had not started)."""
        job = self.engine.submit(prompt_ids, params, stop, pixel_values)
        watcher = asyncio.create_task(_cancel_when_gone(request, job))
        try:
            async for kind, value in self.engine.events(job):
                if kind == "error":
                    raise value
                if kind == "done":
                    return value
        finally:
            watcher.cancel()
        raise ClientGone()


def create_app(model: nn.Module, tokenizer: BPETokenizer, *, model_name: str = "minimind",
               default_max_new_tokens: int = 256, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, max_waiting: int = MAX_WAITING,
               model_card: Mapping[str, object] | None = None) -> FastAPI:
    """The FastAPI app serving ``model`` (see the module docstring for the endpoints).

    ``model_name`` is what ``GET /v1/models`` lists and responses echo;
    ``default_max_new_tokens`` applies when a request does not say (capped by the context);
    ``api_key``, when set, is required as ``Authorization: Bearer <key>``; a body over
    ``max_body_bytes`` is refused (413), and so is a request when ``max_waiting`` wait (503).
    ``model_card`` adds fields to the model's ``/v1/models`` entry (the CLI: profile, stage)
    beside its parameter count.
    """
    engine = Engine(model, tokenizer, max_waiting)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.close()

    app = FastAPI(title="MiniMind", version="1.0", lifespan=lifespan,
                  description="MiniMind from Scratch: a small GPT served with an "
                              "OpenAI-compatible API (notebook 08).")
    app.state.engine = engine
    app.state.server = ServerState(engine, tokenizer, model_name, context_length(model),
                                   default_max_new_tokens, stop_ids(tokenizer), api_key=api_key,
                                   vlm=model if isinstance(model, VisionLanguageModel) else None)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(ClientGone, client_gone)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(InternalErrors)
    app.state.model_card = {"parameters": parameter_count(model), **(model_card or {})}
    guarded = [Depends(require_api_key)]
    app.add_api_route("/", chat_page, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/v1/models", list_models, methods=["GET"], dependencies=guarded)
    app.add_api_route("/generate", generate, methods=["POST"], dependencies=guarded)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"],
                      response_model=None, dependencies=guarded)
    return app


# --------------------------------------------------------------------------- guards


async def require_api_key(request: Request) -> None:
    """401 unless the request carries the server's key (when it has one) as a bearer token."""
    key = request.app.state.server.api_key
    if key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                             key.encode()):
        raise APIError(401, "missing or wrong API key: send the header "
                            "'Authorization: Bearer <key>'", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


class BodySizeLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413, before it is read whole
    (at once when ``Content-Length`` says so; else as soon as the bytes received pass it)."""

    def __init__(self, app: object, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> HTTPException:
        return HTTPException(413, f"the request body is over this server's limit of "
                                  f"{self.max_bytes:,} bytes")

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = await http_error(None, self._too_large())
            response.headers["Connection"] = "close"  # the unread body ends the connection
            return await response(scope, receive, send)
        seen = 0

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise self._too_large()  # FastAPI passes an HTTPException on to http_error
            return message

        await self.app(scope, limited_receive, send)


class InternalErrors:
    """ASGI middleware: an exception no handler answered becomes an OpenAI-style 500, logged
    with its traceback. subtle: letting it reach uvicorn would make uvicorn close the client's
    keep-alive connection, so its next request would fail too."""

    def __init__(self, app: object) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as e:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if started:  # half a response is out: closing the connection is all that is left
                raise
            body = error_body(f"internal server error: {type(e).__name__}: {e}",
                              type="server_error")
            await JSONResponse(body, status_code=500)(scope, receive, send)


# --------------------------------------------------------------------------- error handlers


async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """Pydantic's validation errors as one OpenAI-style 400."""
    problems, params = [], []
    for e in exc.errors():
        if e["type"] == "json_invalid":  # loc is ("body", char offset): say what it means
            error = e.get("ctx", {}).get("error", "")
            problems.append(f"the request body is not valid JSON ({error})")
            continue
        where = ".".join(str(x) for x in e["loc"] if x != "body")
        problems.append(f"{where}: {e['msg']}" if where else e["msg"])
        params.append(where or None)
    return JSONResponse(error_body("; ".join(problems), params[0] if params else None),
                        status_code=400)


async def api_error(_: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def http_error(_: Request | None, exc: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own errors (404, 405, 413, a body that is not UTF-8 JSON) in
    OpenAI's shape instead of ``{"detail": ...}``."""
    message = str(exc.detail)
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        message = f"the request body is not valid UTF-8 (byte {cause.start})"
    elif isinstance(cause, RecursionError):
        message = "the request body's JSON is nested too deeply"
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, type=kind), status_code=exc.status_code,
                        headers=exc.headers)


async def client_gone(_: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it


# --------------------------------------------------------------------------- the endpoints


async def list_models(request: Request) -> dict:
    server: ServerState = request.app.state.server
    return {"object": "list", "data": [
        {"id": server.model_name, "object": "model", "created": server.created,
         "owned_by": "minimind", "context_length": server.context,
         **request.app.state.model_card}]}


async def chat_page() -> HTMLResponse:
    """``GET /``: the chat page, shipped in the package (``minimind_lib/static/chat.html``)."""
    page = resources.files("minimind_lib") / "static" / "chat.html"
    return HTMLResponse(page.read_text(encoding="utf-8"))


def parameter_count(model: nn.Module) -> int:
    """Parameters of the network ``model`` runs, whatever format its weights are in (an int8
    model keeps its weights in buffers): counted on an empty copy of its config."""
    if not isinstance(model, MiniMindForCausalLM):
        return sum(p.numel() for p in model.parameters())
    with torch.device("meta"):  # shapes only, no memory
        return MiniMindForCausalLM(model.config).num_parameters()


async def generate(req: GenerateRequest, request: Request) -> dict:
    """``POST /generate``: the prompt as one chat turn (or raw text with ``chat: false``)."""
    server: ServerState = request.app.state.server
    server.check_size([req.prompt], "prompt")
    params = server.sampling(req.max_new_tokens, "max_new_tokens", temperature=req.temperature,
                             top_k=req.top_k, top_p=req.top_p, seed=req.seed)
    if req.chat:
        prompt_ids = await server.encode(messages=[{"role": "user", "content": req.prompt}])
    else:
        prompt_ids = await server.encode(text=req.prompt)
    params = server.fit(params, prompt_ids, "prompt", req.max_new_tokens, "max_new_tokens")
    stop = server.chat_stop if req.chat else stop_ids(server.tokenizer, (END_OF_TEXT,))
    result = await server.run(request, prompt_ids, params, stop)
    return {"text": result.text, "finish_reason": result.finish_reason,
            "prompt_tokens": len(prompt_ids), "completion_tokens": result.completion_tokens}


async def chat_completions(req: ChatRequest, request: Request) -> dict | StreamingResponse:
    """``POST /v1/chat/completions``: OpenAI's chat API, plain or streamed."""
    server: ServerState = request.app.state.server
    if req.stop is not None:
        raise BadRequest(f"stop sequences are not supported; the model stops at {IM_END}",
                         "stop")
    messages = [m.as_dict() for m in req.messages]
    server.check_size([m["content"] for m in messages], "messages")
    given = req.max_completion_tokens is not None
    max_new = req.max_completion_tokens if given else req.max_tokens
    param = "max_completion_tokens" if given else "max_tokens"
    params = server.sampling(max_new, param, temperature=req.temperature, top_k=req.top_k,
                             top_p=req.top_p, seed=req.seed)
    pixels, image_turn = server.picture(req.messages)
    prompt_ids = await server.encode(messages=messages, image_turn=image_turn)
    params = server.fit(params, prompt_ids, "messages", max_new, param)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": server.model_name}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        job = server.engine.submit(prompt_ids, params, server.chat_stop, pixels)
        return StreamingResponse(_sse(server.engine, job, head, len(prompt_ids), include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    result = await server.run(request, prompt_ids, params, server.chat_stop, pixels)
    return {**head, "object": "chat.completion", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": result.text},
        "finish_reason": result.finish_reason}], "usage": _usage(len(prompt_ids), result)}


def _usage(prompt_tokens: int, result: TextStream) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": prompt_tokens + result.completion_tokens}


def _event(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _sse(engine: Engine, job: _Job, head: dict, prompt_tokens: int,
               include_usage: bool) -> AsyncIterator[str]:
    """The chunks of a streamed chat completion, then ``data: [DONE]``."""
    def chunk(delta: dict, finish: str | None = None) -> str:
        return _event({**head, "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    async for kind, value in engine.events(job):
        if kind == "text":
            yield chunk({"content": value})
        elif kind == "done":
            yield chunk({}, value.finish_reason)
            if include_usage:  # OpenAI's last chunk: no choices, the token counts
                yield _event({**head, "object": "chat.completion.chunk", "choices": [],
                              "usage": _usage(prompt_tokens, value)})
        elif kind == "error":  # the headers are sent already: report the error in the stream
            yield _event(error_body(str(value), type="server_error"))
    yield "data: [DONE]\n\n"


# --------------------------------------------------------------------------- running it


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for tests and the notebook)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """Run ``app`` under uvicorn on a thread of this process (tests, notebook)::

        with BackgroundServer(app) as server:
            httpx.get(server.url + "/v1/models")

    ``port=0`` lets the OS pick a free port; ``url`` says which.
    """

    def __init__(self, app: object, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="on"))
        self.host = host
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}"

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start (is the port in use?)")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


def launch_server_process(model_dir: str | os.PathLike | None = None, port: int | None = None,
                          host: str = "127.0.0.1", profile: str | None = None,
                          device: str | None = None, api_key: str | None = None,
                          timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m minimind_lib serve`` in a background process and wait until it answers.

    Returns ``(process, base_url)``; stop it with ``process.terminate()``. ``api_key`` goes to
    the server through ``$MINIMIND_API_KEY`` (not the command line, which others can list).
    """
    import httpx

    port = port or free_port(host)
    cmd = [sys.executable, "-m", "minimind_lib", "serve", "--host", host, "--port", str(port)]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    if profile is not None:
        cmd += ["--profile", profile]
    if device is not None:
        cmd += ["--device", device]
    env = {**os.environ, API_KEY_ENV: api_key or ""}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    url, deadline = f"http://{host}:{port}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n"
                               f"{proc.stdout.read()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/v1/models", headers=headers, timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.terminate()
    raise TimeoutError(f"the server did not answer on {url} within {timeout:.0f} s")
