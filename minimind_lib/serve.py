"""Talk to the model and serve it over HTTP (notebook 08).

Three layers, each reusing ``MiniMindForCausalLM.stream`` (the one generation loop):

* ``TextStream``: token ids → text chunks.  A token may hold part of a UTF-8 character
  (byte-level BPE), so bytes go through an incremental UTF-8 decoder and a chunk is emitted
  only once its characters are complete.  Stops at a stop token (``<|im_end|>`` in chat).
* ``ChatSession``: a conversation in MiniMind's ChatML (``python -m minimind_lib chat``).
* ``create_app``: a FastAPI app with ``POST /generate`` (prompt in, text out),
  OpenAI-compatible ``POST /v1/chat/completions`` (plain and streaming server-sent events)
  and ``GET /v1/models``, so standard OpenAI clients can talk to it.

Requests are validated (known roles, temperature ≥ 0, top_p in (0, 1], prompt plus new
tokens within the model's context); a bad one gets HTTP 400 with an OpenAI-style error body
``{"error": {"message": ..., "type": "invalid_request_error", "param": ...}}``.

Concurrency: a model must not run two generations interleaved (the KV caches and the global
RNG would mix), so one worker thread runs the jobs one after another while the event loop
keeps accepting requests and streaming the finished tokens back.

>>> SamplingParams(temperature=-1)
Traceback (most recent call last):
...
ValueError: temperature must be >= 0, got -1
"""

import asyncio
import codecs
import contextlib
import itertools
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

import torch
from torch import nn

from minimind_lib.tokenizer import BPETokenizer, encode_chat, load_tokenizer

# fastapi and uvicorn are the optional "serve" extra: imported where used.  subtle: no
# ``from __future__ import annotations`` here, because FastAPI reads the request models from
# the endpoints' annotations, which must be real classes (they are local to ``create_app``).
if TYPE_CHECKING:
    from fastapi import FastAPI

DEFAULT_PORT = 8998
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


# --------------------------------------------------------------------------- text streaming


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next tokens (see ``model.sample_next_token``); ``seed`` makes a sampled
    answer repeatable, ``temperature=0`` is greedy."""

    max_new_tokens: int = 128
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's tensors (int8 models keep most of them in buffers)."""
    return next(itertools.chain(model.parameters(), model.buffers())).device


def context_length(model: nn.Module) -> int:
    """How many positions (prompt + new tokens) the model can attend over."""
    return model.config.max_position_embeddings


def stop_ids(tokenizer: BPETokenizer, tokens: Sequence[str] = STOP_TOKENS) -> set[int]:
    """Ids of the stop tokens the tokenizer has (MiniMind's ``<|im_end|>``, ``<|endoftext|>``)."""
    return {tokenizer.vocab[t] for t in tokens if t in tokenizer.vocab}


class TextStream:
    """Generate from ``prompt_ids`` and iterate over the new text, chunk by chunk.

    Afterwards ``text`` holds the whole answer, ``completion_tokens`` how many tokens were
    generated (the stop token included) and ``finish_reason`` is "stop" (a stop token) or
    "length" (``max_new_tokens`` reached), as in the OpenAI API.  ``cancelled()`` is polled
    between tokens (a client that went away); then ``finish_reason`` is "cancelled".
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer, prompt_ids: Sequence[int],
                 params: SamplingParams, stop: set[int] | None = None,
                 cancelled: Callable[[], bool] = lambda: False) -> None:
        if len(prompt_ids) == 0:
            raise ValueError("the prompt is empty (no tokens)")
        total, limit = len(prompt_ids) + params.max_new_tokens, context_length(model)
        if total > limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens "
                             f"({params.max_new_tokens}) = {total} exceeds the model's context "
                             f"of {limit} tokens")
        self.model, self.tokenizer, self.params = model, tokenizer, params
        self.prompt_ids = list(prompt_ids)
        self.stop = stop_ids(tokenizer) if stop is None else stop
        self.cancelled = cancelled
        self.text, self.completion_tokens, self.finish_reason = "", 0, None

    def __iter__(self) -> Iterator[str]:
        device = model_device(self.model)
        p = self.params
        generator = None
        if p.seed is not None:
            generator = torch.Generator(device).manual_seed(p.seed)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        ids = torch.tensor([self.prompt_ids], device=device)  # (1, T)
        self.model.eval()
        steps = self.model.stream(ids, p.max_new_tokens, p.temperature, p.top_k, p.top_p,
                                  generator=generator)
        self.finish_reason = "length"
        try:
            for token in steps:  # (1,)
                token_id = int(token[0])
                self.completion_tokens += 1
                if token_id in self.stop:
                    self.finish_reason = "stop"
                    break
                chunk = utf8.decode(self.tokenizer.token_bytes(token_id))
                if chunk:  # empty while a multi-byte character is incomplete
                    self.text += chunk
                    yield chunk
                if self.cancelled():
                    self.finish_reason = "cancelled"
                    break
        finally:
            steps.close()
        tail = utf8.decode(b"", final=True)  # an unfinished character becomes U+FFFD
        if tail:
            self.text += tail
            yield tail


def complete(model: nn.Module, tokenizer: BPETokenizer, prompt_ids: Sequence[int],
             params: SamplingParams, stop: set[int] | None = None) -> TextStream:
    """Run a ``TextStream`` to the end and return it (``.text``, ``.finish_reason``, ...)."""
    stream = TextStream(model, tokenizer, prompt_ids, params, stop)
    for _ in stream:
        pass
    return stream


class ChatSession:
    """A conversation with the model in MiniMind's ChatML.

    ``send(text)`` adds the user turn and returns a ``TextStream`` of the answer; once the
    stream is exhausted the answer joins the history.  When the history no longer fits the
    context, the oldest turns (after the system message) are dropped.
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer, system: str | None = None,
                 params: SamplingParams | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.params = params or SamplingParams()
        self.system = system
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def send(self, text: str) -> Iterator[str]:
        """Stream the answer to ``text`` chunk by chunk."""
        self.messages.append({"role": "user", "content": text})
        prompt = self._fit_prompt()
        stream = TextStream(self.model, self.tokenizer, prompt, self.params)
        yield from stream
        self.messages.append({"role": "assistant", "content": stream.text})

    def ask(self, text: str) -> str:
        """The whole answer to ``text``."""
        return "".join(self.send(text))

    def _fit_prompt(self) -> list[int]:
        budget = context_length(self.model) - self.params.max_new_tokens
        while True:
            prompt = encode_chat(self.tokenizer, self.messages, add_generation_prompt=True)
            first = 1 if self.messages[0]["role"] == "system" else 0
            if len(prompt) <= budget or len(self.messages) - first <= 1:
                return prompt  # TextStream reports a single turn that is too long
            del self.messages[first]  # the oldest turn goes first


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


# --------------------------------------------------------------------------- the HTTP API


def create_app(model: nn.Module, tokenizer: BPETokenizer, *, model_name: str = "minimind",
               default_max_new_tokens: int = 256) -> "FastAPI":
    """The FastAPI app serving ``model`` (see the module docstring for the endpoints).

    ``model_name`` is what ``GET /v1/models`` lists and responses echo;
    ``default_max_new_tokens`` applies when a request does not say (capped by the context).
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field

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
        model_config = ConfigDict(extra="ignore")  # other OpenAI fields are accepted, unused
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
        model_config = ConfigDict(extra="forbid")
        prompt: str = Field(min_length=1)
        max_new_tokens: int | None = Field(None, ge=1)
        temperature: float = Field(0.7, ge=0)
        top_k: int | None = Field(None, ge=1)
        top_p: float | None = Field(None, gt=0, le=1)
        seed: int | None = None
        chat: bool = True  # wrap the prompt as one user turn in ChatML (for SFT/DPO models)

    class BadRequest(Exception):
        def __init__(self, message: str, param: str | None = None) -> None:
            super().__init__(message)
            self.message, self.param = message, param

    def error_body(message: str, param: str | None = None) -> dict:
        return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                          "code": None}}

    engine = Engine(model, tokenizer)
    context = context_length(model)
    chat_stop = stop_ids(tokenizer)
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.close()

    app = FastAPI(title="MiniMind", version="1.0", lifespan=lifespan,
                  description="MiniMind from Scratch: a small GPT served with an "
                              "OpenAI-compatible API (notebook 08).")
    app.state.engine = engine

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
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

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, exc: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.param), status_code=400)

    def params_for(prompt_ids: list[int], prompt_param: str, max_new: int | None, param: str,
                   **sampling: object) -> SamplingParams:
        room = context - len(prompt_ids)
        if max_new is None:
            if room < 1:
                raise BadRequest(f"the prompt is {len(prompt_ids)} tokens; the model's context "
                                 f"is {context} tokens, leaving no room for an answer",
                                 prompt_param)
            max_new = min(default_max_new_tokens, room)
        elif max_new > room:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) + {param} ({max_new}) exceeds "
                             f"the model's context of {context} tokens", param)
        return SamplingParams(max_new_tokens=max_new, **sampling)

    async def run(prompt_ids: list[int], params: SamplingParams, stop: set[int]) -> TextStream:
        job = engine.submit(prompt_ids, params, stop)
        async for kind, value in engine.events(job):
            if kind == "error":
                raise value
            if kind == "done":
                return value
        raise RuntimeError("generation ended without a result")

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "minimind",
             "context_length": context}]}

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> dict:
        if req.chat:
            prompt_ids = encode_chat(tokenizer, [{"role": "user", "content": req.prompt}],
                                     add_generation_prompt=True)
        else:
            prompt_ids = tokenizer.encode(req.prompt, allowed_special=set())
        params = params_for(prompt_ids, "prompt", req.max_new_tokens, "max_new_tokens",
                            temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                            seed=req.seed)
        stop = chat_stop if req.chat else stop_ids(tokenizer, ("<|endoftext|>",))
        result = await run(prompt_ids, params, stop)
        return {"text": result.text, "finish_reason": result.finish_reason,
                "prompt_tokens": len(prompt_ids), "completion_tokens": result.completion_tokens}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatRequest) -> dict | StreamingResponse:
        if req.stop is not None:
            raise BadRequest("stop sequences are not supported; the model stops at <|im_end|>",
                             "stop")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        prompt_ids = encode_chat(tokenizer, messages, add_generation_prompt=True)
        max_new = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        params = params_for(prompt_ids, "messages", max_new, param, temperature=req.temperature,
                            top_k=req.top_k, top_p=req.top_p, seed=req.seed)
        ident, now = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": ident, "created": now, "model": model_name}

        def usage(result: TextStream) -> dict:
            return {"prompt_tokens": len(prompt_ids), "completion_tokens": result.completion_tokens,
                    "total_tokens": len(prompt_ids) + result.completion_tokens}

        if not req.stream:
            result = await run(prompt_ids, params, chat_stop)
            return {**head, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason}], "usage": usage(result)}

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        job = engine.submit(prompt_ids, params, chat_stop)

        def event(body: dict) -> str:  # one server-sent event
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        def chunk(delta: dict, finish: str | None = None) -> str:
            return event({**head, "object": "chat.completion.chunk",
                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        async def sse() -> AsyncIterator[str]:
            yield chunk({"role": "assistant", "content": ""})
            async for kind, value in engine.events(job):
                if kind == "text":
                    yield chunk({"content": value})
                elif kind == "done":
                    yield chunk({}, value.finish_reason)
                    if include_usage:  # OpenAI's last chunk: no choices, the token counts
                        yield event({**head, "object": "chat.completion.chunk", "choices": [],
                                     "usage": usage(value)})
                else:  # the headers are sent already: report the error in the stream
                    yield event({"error": {"message": str(value), "type": "server_error"}})
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    return app


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


def chat_loop(session: ChatSession, read: Callable[[str], str] = input,
              out: TextIO = sys.stdout) -> None:
    """The interactive chat of ``python -m minimind_lib chat``: answers stream to ``out`` as
    they are generated; ``/reset`` forgets the conversation, ``/exit`` (or Ctrl-D) quits."""
    out.write("Chat with MiniMind. /reset starts over, /exit quits.\n")
    while True:
        try:
            text = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            session.reset()
            out.write("(conversation cleared)\n")
        elif text:
            out.write("minimind> ")
            for piece in session.send(text):
                out.write(piece)
                out.flush()
            out.write("\n")


# --------------------------------------------------------------------------- which model


SERVE_ORDER = ("dpo", "sft", "pretrain")  # the most trained stage first


def find_model_dir(root: str | os.PathLike) -> Path:
    """The newest finished stage under ``root`` (``runs/<profile>``): dpo, else sft, else
    pretrain.  A stage is finished when its ``stage.json`` marker exists."""
    from minimind_lib.pipeline import read_marker

    root = Path(root)
    for stage in SERVE_ORDER:
        if read_marker(root / stage) is not None:
            return root / stage
    raise FileNotFoundError(
        f"no finished stage under {root} (looked for {', '.join(SERVE_ORDER)}); train one with "
        f"`python -m minimind_lib all --profile <profile>` or pass --model DIR")


def find_tokenizer(model_dir: str | os.PathLike) -> BPETokenizer:
    """The tokenizer of a stage folder: its own ``tokenizer.json``, else the run's
    ``tokenizer`` stage beside it, else the course tokenizer (``data/tokenizer``)."""
    model_dir = Path(model_dir)
    for path in (model_dir / "tokenizer.json", model_dir.parent / "tokenizer" / "tokenizer.json"):
        if path.is_file():
            return BPETokenizer.from_file(path)
    return load_tokenizer()


def load_for_serving(model_dir: str | os.PathLike,
                     device: str | torch.device | None = None) -> tuple[nn.Module, BPETokenizer]:
    """Model (fp32 or int8 folder) and tokenizer of ``model_dir``, ready to generate."""
    from minimind_lib.checkpoint import load_model
    from minimind_lib.device import pick_device

    model = load_model(model_dir, device or pick_device())
    tokenizer = find_tokenizer(model_dir)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model "
                         f"only {model.config.vocab_size}")
    return model, tokenizer
