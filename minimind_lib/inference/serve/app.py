"""Serve the model over HTTP, OpenAI-compatible (notebook 08).

``create_app(model, tokenizer)`` returns a FastAPI app with ``POST /generate`` (prompt in, text
out), ``POST /v1/chat/completions`` (plain and streaming server-sent events) and
``GET /v1/models`` (with the model card: parameters, profile, stage), so standard OpenAI clients
can talk to it; ``GET /v1/tools`` and ``POST /v1/tools/run`` (the course's tools, run by the
safe executor, for the chat page's tool loop); and ``GET /``: a chat page
(``static/chat.html``, plain HTML and JavaScript that streams from ``/v1/chat/completions``;
nothing loaded from elsewhere, so it works offline). The
text comes from ``minimind_lib.inference.chat.ReplyText``, the same decoding of tokens to text
the terminal chat uses.

Pictures: when the model is a vision-language model (``minimind_lib.vision.vlm``, a ``vision/vlm``
folder: notebook 13), a user message may hold one OpenAI ``image_url`` part whose URL is a
``data:image/...;base64,...`` URL; the picture goes at the start of that message, where the
VLM was trained to see it. A text-only model, a web link, or a second picture is a 400.

Tools and thinking (notebook 14): ``tools`` / ``tool_choice`` (auto, none, a named function)
are rendered in the system turn; a reply's ``<tool_call>`` blocks come back as
``message.tool_calls`` with ``finish_reason: "tool_calls"`` (streamed: ``delta.tool_calls``),
and ``tool`` messages send the results back. ``chat_template_kwargs: {"enable_thinking":
true}`` (or MiniMind's ``open_thinking``) opens the think block; the reasoning comes back as
``reasoning_content`` (streamed: ``delta.reasoning_content``). ``serve.tool_calls`` reads the
text; what does not parse as an offered call stays content. The server runs no tool of a
client's: the client executes its calls (the chat page asks ``/v1/tools/run``).

Every error, whatever its cause, has OpenAI's shape
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``:

* 400: a bad request. Sampling settings are checked by ``inference.chat.SamplingParams`` (the one
  validator, shared with the library and the CLI) and a bad one is named in ``param``; known
  roles (``developer`` is read as ``system``), text that is valid Unicode, a prompt plus new
  tokens within the model's context, a body that is UTF-8 JSON.
* 401: a server started with an API key (``create_app(api_key=...)``, ``serve --api-key``)
  wants ``Authorization: Bearer <key>``.
* 413: a body over ``max_body_bytes``, or messages with more characters than could fit the
  context (checked before tokenising, which runs off the event loop).
* 503 with ``Retry-After``: ``max_waiting`` requests are already waiting for a place.
* 500: a bug; the traceback goes to the server log, and the connection stays usable.

Concurrency: one worker thread (``Engine``) owns the model while the event loop keeps accepting
requests and streaming the finished tokens back. Requests that arrive together decode together
(continuous batching: up to ``max_batch`` rows, each with its own sampling settings, seed and
budget; a greedy answer is the same as alone); a model that cannot batch (a vision-language
model) answers one request after another. A client that hangs up (streaming or not) cancels
its job, waiting or running, and frees its place in the batch.

The request models and handlers live at module level; a handler finds its model, tokenizer
and engine in ``request.app.state.server`` (a ``ServerState``).
"""


# subtle: no ``from __future__ import annotations`` here: FastAPI reads the request models from
# the handlers' annotations, which must be real classes at run time.
import asyncio
import base64
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException
from torch import nn

from minimind_lib.inference.chat import (
    ReplyText,
    SamplingError,
    SamplingParams,
    context_length,
    stop_ids,
)
from minimind_lib.inference.serve.body import BODY_TIMEOUT_S, BodySizeLimit
from minimind_lib.inference.serve.engine import (
    MAX_BATCH,
    MAX_WAITING,
    Engine,
    _cancel_when_gone,
    _Job,
)
from minimind_lib.inference.serve.errors import (
    APIError,
    BadRequest,
    ClientGone,
    api_error,
    client_gone,
    error_body,
    http_error,
    invalid_request,
)
from minimind_lib.inference.serve.schemas import (
    ChatRequest,
    GenerateRequest,
    Message,
    ToolRunRequest,
)
from minimind_lib.inference.serve.structured_outputs import check_room, reply_constraint
from minimind_lib.inference.serve.tool_calls import ReplySplitter, choose_tools
from minimind_lib.model.decoder import MiniMindForCausalLM
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END
from minimind_lib.tools.registry import execute_tool, tool_schemas
from minimind_lib.vision.clip import to_pixels
from minimind_lib.vision.pictures import image_from_data_url
from minimind_lib.vision.vlm import VisionLanguageModel, encode_image_chat

MAX_BODY_BYTES = 4 << 20  # a full 32k-token context is ~0.5M characters, ~3 MB as \u-escaped JSON
log = logging.getLogger("minimind_lib.inference.serve")


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
                     image_turn: int | None = None, tools: list[dict] | None = None,
                     open_thinking: bool = False) -> list[int]:
        """The prompt's ids: ``messages`` in the chat template with the generation prompt
        (``tools`` in the system turn, the think block open with ``open_thinking``; a VLM's
        image slots in message ``image_turn``), or raw ``text``. Tokenising takes ~1 s per MB
        of text, so it runs on a thread, not the event loop. A conversation the template
        cannot render (a call whose arguments are not JSON, tools under MiniMind2's
        template) is a 400."""
        if image_turn is not None:
            return await asyncio.to_thread(encode_image_chat, self.tokenizer, messages,
                                           self.vlm.image_tokens, True, image_turn)
        if messages is not None:
            try:
                return await asyncio.to_thread(functools.partial(
                    encode_chat, self.tokenizer, messages, True, tools=tools or None,
                    open_thinking=open_thinking))
            except ValueError as e:
                raise BadRequest(str(e), "tools" if "tools" in str(e) else "messages") \
                    from None
        return await asyncio.to_thread(self.tokenizer.encode, text, set())

    async def picture(self, messages: list[Message]) -> tuple[torch.Tensor | None, int | None]:
        """The request's picture as pixels (1, 3, H, W) and the message holding it, or
        (None, None). A 400 when the model reads no pictures, when there is more than one,
        when it is not in a user message, or when it is not a readable ``data:`` URL (within
        the size limits its header is checked against). Decoded off the event loop, so a big
        picture never holds up other requests."""
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
            image = await asyncio.to_thread(image_from_data_url, url,
                                            self.vlm.encoder.config.image_size)
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
                  stop: set[int], pixel_values: torch.Tensor | None = None,
                  constraint: object = None) -> ReplyText:
        """Generate to the end on the engine; the finished stream. A client that hangs up
        cancels the job (then the stream's ``finish_reason`` is "cancelled", or ``ClientGone``
        when it had not started)."""
        job = self.engine.submit(prompt_ids, params, stop, pixel_values, constraint)
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


#: what a server on 127.0.0.1 without an API key answers to (``allowed_hosts``)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_api_key(key: str | None) -> None:
    """Refuse a key no client could send: HTTP headers carry ASCII, and a bearer token has no
    spaces (a UTF-8 key would never match)."""
    if key is not None and not (key and all(33 <= ord(c) <= 126 for c in key)):
        raise ValueError("the API key must be printable ASCII without spaces (HTTP headers "
                         "carry ASCII, so a client could never send this one)")


def create_app(model: nn.Module, tokenizer: BPETokenizer, *, model_name: str = "minimind",
               default_max_new_tokens: int = 256, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, max_waiting: int = MAX_WAITING,
               max_batch: int = MAX_BATCH, model_card: Mapping[str, object] | None = None,
               allowed_hosts: Sequence[str] | None = None,
               body_timeout: float = BODY_TIMEOUT_S) -> FastAPI:
    """The FastAPI app serving ``model`` (see the module docstring for the endpoints).

    ``model_name`` is what ``GET /v1/models`` lists and responses echo;
    ``default_max_new_tokens`` applies when a request does not say (capped by the context);
    ``api_key``, when set, is required as ``Authorization: Bearer <key>``; a body over
    ``max_body_bytes`` is refused (413), one that takes over ``body_timeout`` seconds to
    arrive too (408), and so is a request when ``max_waiting`` wait (503);
    up to ``max_batch`` requests decode together.
    ``model_card`` adds fields to the model's ``/v1/models`` entry (the CLI: profile, stage)
    beside its parameter count. ``allowed_hosts``, when given, are the only ``Host`` names
    answered (the CLI sets ``LOOPBACK_HOSTS`` for a keyless server on loopback, so a web page
    that rebinds its own name to 127.0.0.1 cannot reach it). The key guards every route but
    the chat page; FastAPI's ``/docs`` pages (which load scripts from a CDN) are not served.
    """
    check_api_key(api_key)
    engine = Engine(model, tokenizer, max_waiting, max_batch)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.close()

    app = FastAPI(title="MiniMind", version="1.0", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None,
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
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes, timeout=body_timeout)
    app.add_middleware(InternalErrors)
    if allowed_hosts is not None:  # outermost: a foreign Host gets nothing else
        app.add_middleware(HostAllowList, hosts=tuple(allowed_hosts))
    app.state.model_card = {"parameters": parameter_count(model), **(model_card or {})}
    guarded = [Depends(require_api_key)]
    app.add_api_route("/", chat_page, methods=["GET"], response_class=HTMLResponse)
    app.add_api_route("/v1/models", list_models, methods=["GET"], dependencies=guarded)
    app.add_api_route("/generate", generate, methods=["POST"], dependencies=guarded)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"],
                      response_model=None, dependencies=guarded)
    app.add_api_route("/v1/tools", list_tools, methods=["GET"], dependencies=guarded)
    app.add_api_route("/v1/tools/run", run_tool, methods=["POST"], dependencies=guarded)
    app.add_api_route("/openapi.json", openapi_schema, methods=["GET"], dependencies=guarded,
                      include_in_schema=False)
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


def host_name(host: str) -> str:
    """A ``Host`` header without its port.

    >>> host_name("localhost:8998"), host_name("[::1]:8998"), host_name("127.0.0.1")
    ('localhost', '::1', '127.0.0.1')
    """
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class HostAllowList:
    """ASGI middleware: a request whose ``Host`` (port aside) is not in ``hosts`` gets a 400."""

    def __init__(self, app: object, hosts: tuple[str, ...]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host_name(host).lower() not in self.hosts:
            message = (f"Host {host!r} is not one this server answers to: it listens on loopback "
                       f"without an API key, so only {', '.join(self.hosts)} reach it (a guard "
                       "against DNS rebinding); use one of those, or start it with --api-key")
            return await JSONResponse(error_body(message, "Host"), status_code=400)(
                scope, receive, send)
        await self.app(scope, receive, send)


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


# --------------------------------------------------------------------------- the endpoints


async def list_models(request: Request) -> dict:
    server: ServerState = request.app.state.server
    return {"object": "list", "data": [
        {"id": server.model_name, "object": "model", "created": server.created,
         "owned_by": "minimind", "context_length": server.context,
         **request.app.state.model_card}]}


async def list_tools() -> dict:
    """``GET /v1/tools``: the course's tools as OpenAI function schemas (what the chat page
    offers the model)."""
    return {"object": "list", "data": tool_schemas()}


async def run_tool(req: ToolRunRequest) -> dict:
    """``POST /v1/tools/run``: one of the course's own tools, by name, through the safe
    executor (arguments are data; a bad call is the error message the model reads); nothing
    else can run here."""
    return {"name": req.name,
            "content": await asyncio.to_thread(execute_tool, req.name, req.arguments)}


async def chat_page() -> HTMLResponse:
    """``GET /``: the chat page, shipped in the package (``serve/static/chat.html``), with a
    Content-Security-Policy that allows its own inline script and style (by hash) and requests
    to this server, nothing else, and no framing by other sites."""
    page, headers = _chat_page()
    return HTMLResponse(page, headers=headers)


@functools.cache
def _chat_page() -> tuple[str, dict[str, str]]:
    page = (resources.files("minimind_lib.inference.serve") / "static" / "chat.html").read_text(
        encoding="utf-8")

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
                        for b in bodies)

    policy = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
              "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
    return page, {"Content-Security-Policy": policy, "X-Frame-Options": "DENY",
                  "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


async def openapi_schema(request: Request) -> JSONResponse:
    """``GET /openapi.json``: the API's schema, behind the key like every route but ``/``."""
    return JSONResponse(request.app.openapi())


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
    unsupported = req.unsupported()
    if unsupported:
        hint = ("OpenAI's deprecated function calling: send tools (and tool_choice) instead"
                if unsupported.startswith("function") else "this server does not support it")
        raise BadRequest(f"{unsupported}: {hint}", unsupported)
    try:
        offered = choose_tools([t.schema() for t in req.tools or []], req.tool_choice)
    except ValueError as e:
        raise BadRequest(str(e), "tool_choice") from None
    thinking = req.thinking()
    messages = [m.as_dict() for m in req.messages]
    server.check_size([m["content"] for m in messages] + [json.dumps(offered),
                                                          json.dumps(req.response_format)],
                      "messages")
    constraint = await reply_constraint(req, offered, thinking, server.tokenizer,
                                        vision=server.vlm is not None)
    given = req.max_completion_tokens is not None
    max_new = req.max_completion_tokens if given else req.max_tokens
    param = "max_completion_tokens" if given else "max_tokens"
    params = server.sampling(max_new, param, temperature=req.temperature, top_k=req.top_k,
                             top_p=req.top_p, seed=req.seed)
    pixels, image_turn = await server.picture(req.messages)
    if image_turn is not None and (offered or thinking):
        raise BadRequest("tools and thinking are for text-only conversations; the "
                         "vision-language model's template has neither", "messages")
    prompt_ids = await server.encode(messages=messages, image_turn=image_turn, tools=offered,
                                     open_thinking=thinking)
    params = server.fit(params, prompt_ids, "messages", max_new, param)
    check_room(constraint, params.max_new_tokens, param)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": server.model_name}
    splitter = ReplySplitter({t["function"]["name"] for t in offered}, thinking)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        job = server.engine.submit(prompt_ids, params, server.chat_stop, pixels, constraint)
        return StreamingResponse(_sse(server.engine, job, head, len(prompt_ids), include_usage,
                                      splitter),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    result = await server.run(request, prompt_ids, params, server.chat_stop, pixels, constraint)
    splitter.feed(result.text)
    splitter.finish()
    return {**head, "object": "chat.completion", "choices": [{
        "index": 0, "message": splitter.message(),
        "finish_reason": splitter.finish_reason(result.finish_reason)}],
        "usage": _usage(len(prompt_ids), result)}


def _usage(prompt_tokens: int, result: ReplyText) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": prompt_tokens + result.completion_tokens}


def _event(body: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _sse(engine: Engine, job: _Job, head: dict, prompt_tokens: int,
               include_usage: bool, splitter: ReplySplitter) -> AsyncIterator[str]:
    """The chunks of a streamed chat completion (``splitter`` turns the text into content,
    reasoning and tool-call deltas), then ``data: [DONE]``."""
    def chunk(delta: dict, finish: str | None = None) -> str:
        return _event({**head, "object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    async for kind, value in engine.events(job):
        if kind == "text":
            for delta in splitter.feed(value):
                yield chunk(delta)
        elif kind == "done":
            for delta in splitter.finish():
                yield chunk(delta)
            yield chunk({}, splitter.finish_reason(value.finish_reason))
            if include_usage:  # OpenAI's last chunk: no choices, the token counts
                yield _event({**head, "object": "chat.completion.chunk", "choices": [],
                              "usage": _usage(prompt_tokens, value)})
        elif kind == "error":  # the headers are sent already: report the error in the stream
            yield _event(error_body(str(value), type="server_error"))
    yield "data: [DONE]\n\n"
