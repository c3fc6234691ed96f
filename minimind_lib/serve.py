"""Serve the model over HTTP, OpenAI-compatible (notebook 08).

``create_app(model, tokenizer)`` returns a FastAPI app with ``POST /generate`` (prompt in, text
out), ``POST /v1/chat/completions`` (plain and streaming server-sent events) and
``GET /v1/models`` (with the model card: parameters, profile, stage), so standard OpenAI clients
can talk to it, and ``GET /``: a chat page (``static/chat.html``, plain HTML and JavaScript that
streams from ``/v1/chat/completions``; nothing loaded from elsewhere, so it works offline). The
text comes from ``minimind_lib.inference.TextStream``, the same stream the terminal chat uses.

Requests are validated (known roles, temperature ≥ 0, top_p in (0, 1], prompt plus new
tokens within the model's context); a bad one gets HTTP 400 with an OpenAI-style error body
``{"error": {"message": ..., "type": "invalid_request_error", "param": ...}}``.

Concurrency: a model must not run two generations interleaved (the KV caches and the global
RNG would mix), so one worker thread (``Engine``) runs the jobs one after another while the
event loop keeps accepting requests and streaming the finished tokens back.

The request models and handlers live at module level; a handler finds its model, tokenizer
and engine in ``request.app.state.server`` (a ``ServerState``).
"""

# subtle: no ``from __future__ import annotations`` here: FastAPI reads the request models from
# the handlers' annotations, which must be real classes at run time.
import asyncio
import contextlib
import json
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
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("minimind_lib.serve needs FastAPI: pip install -e '.[serve]'") from e

from minimind_lib.inference import SamplingParams, TextStream, context_length, stop_ids
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.tokenizer import END_OF_TEXT, IM_END, BPETokenizer, encode_chat

DEFAULT_PORT = 8998

# --------------------------------------------------------------------------- the worker


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    stop: set[int]
    loop: asyncio.AbstractEventLoop
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
    the same whether it ran alone or among 16 others.
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               stop: set[int]) -> _Job:
        """Queue a job; read its events with ``events(job)``."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="minimind-generate",
                                                daemon=True)
                self._thread.start()
        job = _Job(prompt_ids, params, stop, asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    async def events(self, job: _Job) -> AsyncIterator[tuple[str, object]]:
        """("text", chunk) ... then ("done", TextStream) or ("error", exception)."""
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
            if job.cancel.is_set():
                continue
            try:
                stream = TextStream(self.model, self.tokenizer, job.prompt_ids, job.params,
                                    job.stop, cancelled=job.cancel.is_set)
                with torch.inference_mode():
                    for chunk in stream:
                        job.emit("text", chunk)
                job.emit("done", stream)
            except Exception as e:  # reported to the client, the worker lives on
                job.emit("error", e)

# --------------------------------------------------------------------------- request bodies


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else \
            "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """OpenAI's chat completion request (the fields this server uses; others are ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None


class GenerateRequest(BaseModel):
    """``POST /generate``: one prompt, its text back."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.7, ge=0)
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    chat: bool = True  # wrap the prompt as one user turn in ChatML (for SFT/DPO models)


class BadRequest(Exception):
    """A request that is well-formed but cannot be served (answered with HTTP 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def error_body(message: str, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


# --------------------------------------------------------------------------- the app


@dataclass
class ServerState:
    """What every handler needs: the engine, the tokenizer and the served model's limits."""

    engine: Engine
    tokenizer: BPETokenizer
    model_name: str
    context: int  # positions the model attends over (prompt + answer)
    default_max_new_tokens: int
    chat_stop: set[int]
    created: int = field(default_factory=lambda: int(time.time()))

    def sampling(self, prompt_ids: list[int], prompt_param: str, max_new: int | None,
                 param: str, **sampling: object) -> SamplingParams:
        """The request's ``SamplingParams``; ``max_new`` defaults to what fits the context."""
        room = self.context - len(prompt_ids)
        if max_new is None:
            if room < 1:
                raise BadRequest(f"the prompt is {len(prompt_ids)} tokens; the model's context "
                                 f"is {self.context} tokens, leaving no room for an answer",
                                 prompt_param)
            max_new = min(self.default_max_new_tokens, room)
        elif max_new > room:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + {param} ({max_new}) exceeds "
                             f"the model's context of {self.context} tokens", param)
        return SamplingParams(max_new_tokens=max_new, **sampling)

    async def run(self, prompt_ids: list[int], params: SamplingParams,
                  stop: set[int]) -> TextStream:
        """Generate to the end on the engine; the finished stream."""
        job = self.engine.submit(prompt_ids, params, stop)
        async for kind, value in self.engine.events(job):
            if kind == "error":
                raise value
            if kind == "done":
                return value
        raise RuntimeError("generation ended without a result")


def create_app(model: nn.Module, tokenizer: BPETokenizer, *, model_name: str = "minimind",
               default_max_new_tokens: int = 256,
               model_card: Mapping[str, object] | None = None) -> FastAPI:
    """The FastAPI app serving ``model`` (see the module docstring for the endpoints).

    ``model_name`` is what ``GET /v1/models`` lists and responses echo;
    ``default_max_new_tokens`` applies when a request does not say (capped by the context);
    ``model_card`` adds fields to the model's ``/v1/models`` entry (the CLI: profile, stage)
    beside its parameter count.
    """
    engine = Engine(model, tokenizer)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.close()

    app = FastAPI(title="MiniMind", version="1.0", lifespan=lifespan,
                  description="MiniMind from Scratch: a small GPT served with an "
                              "OpenAI-compatible API (notebook 08).")
    app.state.engine = engine
    app.state.server = ServerState(engine, tokenizer, model_name, context_length(model),
                                   default_max_new_tokens, stop_ids(tokenizer))
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(BadRequest, bad_request)
    app.state.model_card = {"parameters": parameter_count(model), **(model_card or {})}
    app.add_api_route("/", chat_page, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/generate", generate, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"],
                      response_model=None)
    return app


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


async def bad_request(_: Request, exc: BadRequest) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.param), status_code=400)


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
    if req.chat:
        prompt_ids = encode_chat(server.tokenizer, [{"role": "user", "content": req.prompt}],
                                 add_generation_prompt=True)
    else:
        prompt_ids = server.tokenizer.encode(req.prompt, allowed_special=set())
    params = server.sampling(prompt_ids, "prompt", req.max_new_tokens, "max_new_tokens",
                             temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                             seed=req.seed)
    stop = server.chat_stop if req.chat else stop_ids(server.tokenizer, (END_OF_TEXT,))
    result = await server.run(prompt_ids, params, stop)
    return {"text": result.text, "finish_reason": result.finish_reason,
            "prompt_tokens": len(prompt_ids), "completion_tokens": result.completion_tokens}


async def chat_completions(req: ChatRequest, request: Request) -> dict | StreamingResponse:
    """``POST /v1/chat/completions``: OpenAI's chat API, plain or streamed."""
    server: ServerState = request.app.state.server
    if req.stop is not None:
        raise BadRequest(f"stop sequences are not supported; the model stops at {IM_END}",
                         "stop")
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    prompt_ids = encode_chat(server.tokenizer, messages, add_generation_prompt=True)
    max_new = req.max_completion_tokens or req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    params = server.sampling(prompt_ids, "messages", max_new, param, temperature=req.temperature,
                             top_k=req.top_k, top_p=req.top_p, seed=req.seed)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": server.model_name}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        job = server.engine.submit(prompt_ids, params, server.chat_stop)
        return StreamingResponse(_sse(server.engine, job, head, len(prompt_ids), include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    result = await server.run(prompt_ids, params, server.chat_stop)
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
        else:  # the headers are sent already: report the error in the stream
            yield _event({"error": {"message": str(value), "type": "server_error"}})
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
                          device: str | None = None,
                          timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m minimind_lib serve`` in a background process and wait until it answers.

    Returns ``(process, base_url)``; stop it with ``process.terminate()``.
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
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, deadline = f"http://{host}:{port}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n"
                               f"{proc.stdout.read()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    proc.terminate()
    raise TimeoutError(f"the server did not answer on {url} within {timeout:.0f} s")
