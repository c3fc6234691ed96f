"""Talk to a model: sampling parameters, text streaming and a chat session (notebook 08).

Two layers over ``MiniMindForCausalLM.stream`` (the one generation loop):

* ``TextStream``: token ids → text chunks (``ReplyText``).  A token may hold part of a UTF-8
  character (byte-level BPE), so bytes go through an incremental UTF-8 decoder and a chunk is
  emitted only once its characters are complete.  Stops at a stop token (``<|im_end|>`` in
  chat). The server's batched engine feeds a ``ReplyText`` per request the same way.
* ``ChatSession``: a conversation in MiniMind's ChatML (``python -m minimind_lib chat``).

``minimind_lib.inference.serve`` puts the same streams behind an OpenAI-compatible HTTP API.

``SamplingParams`` is the one validator of sampling settings: the library, the server (a bad
value is an HTTP 400 naming the field) and the CLI all build one.

>>> SamplingParams(temperature=-1)
Traceback (most recent call last):
...
minimind_lib.inference.chat.SamplingError: temperature must be a finite number >= 0, got -1
"""

from __future__ import annotations

import codecs
import itertools
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

import torch
from torch import nn

from minimind_lib.core.device import check_seed
from minimind_lib.model.sampling import sampling_problem
from minimind_lib.tokenizer.bpe import BPETokenizer, text_problem
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END
from minimind_lib.tools.loop import run_with_tools
from minimind_lib.tools.registry import tool_schemas

STOP_TOKENS = (IM_END, END_OF_TEXT)  # a chat reply ends at either
#: Seeds go to a ``torch.Generator``; the CPU one (a 32-bit Mersenne Twister) keeps only the low
#: 32 bits, so 5 and 2**32 + 5 would give the same answer. Larger seeds are refused instead.


class SamplingError(ValueError):
    """A sampling setting out of range; ``field`` names it (``temperature``, ``seed``, ...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next tokens (see ``model.sampling.sample_next_token``); ``seed`` (0 ..
    ``core.device.MAX_SEED``) makes a sampled answer repeatable, ``temperature=0`` is greedy
    (and so is any temperature below ``model.sampling.MIN_TEMPERATURE``). A bad value raises
    ``SamplingError``.

    >>> try:
    ...     SamplingParams(seed=2**32)
    ... except SamplingError as e:
    ...     print(f"{type(e).__name__} ({e.field}): {e}")
    SamplingError (seed): seed must be an integer in [0, 4294967295], got 4294967296
    """

    max_new_tokens: int = 128
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        def is_int(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SamplingError("max_new_tokens", f"max_new_tokens must be an integer >= 1, "
                                                  f"got {self.max_new_tokens!r}")
        problem = sampling_problem(self.temperature, self.top_k, self.top_p)
        if problem:
            raise SamplingError(*problem)
        if self.seed is not None:
            try:
                check_seed(self.seed)
            except ValueError as e:
                raise SamplingError("seed", str(e)) from None


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's tensors (int8 models keep most of them in buffers)."""
    return next(itertools.chain(model.parameters(), model.buffers())).device


def context_length(model: nn.Module) -> int:
    """How many positions (prompt + new tokens) the model can attend over."""
    return model.config.max_position_embeddings


def stop_ids(tokenizer: BPETokenizer, tokens: Sequence[str] = STOP_TOKENS) -> set[int]:
    """Ids of the stop tokens the tokenizer has (MiniMind's ``<|im_end|>``, ``<|endoftext|>``)."""
    return {tokenizer.vocab[t] for t in tokens if t in tokenizer.vocab}


class ReplyText:
    """One reply's token ids → its text, chunk by chunk: a token may hold part of a UTF-8
    character (byte-level BPE), so bytes go through an incremental UTF-8 decoder and a chunk is
    given out once its characters are complete. A stop token ends the reply and adds no text.

    ``text`` holds the reply so far, ``completion_tokens`` the tokens pushed (a stop token
    included) and ``finish_reason`` "stop" (a stop token), or what ``end`` was told: "length"
    (the budget ran out) or "cancelled" (the client went away), as in the OpenAI API.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> reply = ReplyText(tok, stop={tok.token_to_id("<|im_end|>")})
    >>> [reply.push(t) for t in tok.encode("猫咪")], reply.finish_reason  # 2 tokens a character
    (['', '猫', '', '咪'], None)
    >>> reply.push(tok.token_to_id("<|im_end|>")), reply.end("length"), reply.finish_reason
    ('', '', 'stop')
    """

    def __init__(self, tokenizer: BPETokenizer, stop: set[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = stop_ids(tokenizer) if stop is None else stop
        self.text, self.completion_tokens, self.finish_reason = "", 0, None
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text one more token completes ('' while a character is unfinished)."""
        self.completion_tokens += 1
        if token_id in self.stop:
            self.finish_reason = "stop"
            return ""
        chunk = self._utf8.decode(self.tokenizer.token_bytes(token_id))
        self.text += chunk
        return chunk

    def end(self, reason: str) -> str:
        """Close the reply (``finish_reason`` becomes ``reason`` unless a stop token ended it);
        returns the text of an unfinished last character (U+FFFD), usually ''."""
        if self.finish_reason is None:
            self.finish_reason = reason
        tail = self._utf8.decode(b"", final=True)
        self.text += tail
        return tail


class TextStream(ReplyText):
    """Generate from ``prompt_ids`` and iterate over the new text, chunk by chunk (a
    ``ReplyText`` fed by ``model.stream``).

    Afterwards ``text`` holds the whole answer, ``completion_tokens`` how many tokens were
    generated (the stop token included) and ``finish_reason`` is "stop" (a stop token) or
    "length" (``max_new_tokens`` reached), as in the OpenAI API.  ``cancelled()`` is polled
    between tokens (a client that went away); then ``finish_reason`` is "cancelled".
    """

    def __init__(self, model: nn.Module, tokenizer: BPETokenizer, prompt_ids: Sequence[int],
                 params: SamplingParams, stop: set[int] | None = None,
                 cancelled: Callable[[], bool] = lambda: False,
                 pixel_values: torch.Tensor | None = None, constraint: object = None) -> None:
        check_budget(model, prompt_ids, params)
        super().__init__(tokenizer, stop)
        self.model, self.params = model, params
        self.prompt_ids = list(prompt_ids)
        self.cancelled = cancelled
        self.pixel_values = pixel_values  # a VLM's picture (vlm.VisionLanguageModel.stream)
        self.constraint = constraint  # a grammar (inference.structured.constrain) to follow

    def __iter__(self) -> Iterator[str]:
        device = model_device(self.model)
        p = self.params
        ids = torch.tensor([self.prompt_ids], device=device)  # (1, T)
        self.model.eval()
        picture = ({} if self.pixel_values is None
                   else {"pixel_values": self.pixel_values.to(device)})
        if self.constraint is not None:
            picture["constraints"] = [self.constraint.start()]
        steps = self.model.stream(ids, p.max_new_tokens, p.temperature, p.top_k, p.top_p,
                                  generator=seeded_generator(p.seed, device), **picture)
        try:
            for token in steps:  # (1,)
                chunk = self.push(int(token[0]))
                if chunk:  # empty while a multi-byte character is incomplete
                    yield chunk
                if self.finish_reason is not None:
                    break
                if self.cancelled():
                    self.finish_reason = "cancelled"
                    break
        finally:
            steps.close()
        tail = self.end("length")
        if tail:
            yield tail


def check_budget(model: nn.Module, prompt_ids: Sequence[int], params: SamplingParams) -> None:
    """A ``ValueError`` for an empty prompt, or one that leaves no room for ``max_new_tokens``
    in the model's context."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty (no tokens)")
    total, limit = len(prompt_ids) + params.max_new_tokens, context_length(model)
    if total > limit:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens "
                         f"({params.max_new_tokens}) = {total} exceeds the model's context "
                         f"of {limit} tokens")


def seeded_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator on ``device`` seeded with ``seed`` (None: the global RNG)."""
    return None if seed is None else torch.Generator(device).manual_seed(seed)


def complete(model: nn.Module, tokenizer: BPETokenizer, prompt_ids: Sequence[int],
             params: SamplingParams, stop: set[int] | None = None) -> TextStream:
    """Run a ``TextStream`` to the end and return it (``.text``, ``.finish_reason``, ...)."""
    stream = TextStream(model, tokenizer, prompt_ids, params, stop)
    for _ in stream:
        pass
    return stream


class ChatSession:
    """A conversation with the model in its tokenizer's chat format (``template_of``).

    ``send(text)`` adds the user turn and returns a ``TextStream`` of the answer; once the
    stream is exhausted the turn and its answer join the history.  When the history no longer
    fits the context, the oldest turns (after the system message) are dropped.  A message that
    cannot be sent (too long for the context on its own, or not valid text) raises
    ``ValueError`` at once and leaves the conversation as it was.
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
        """The answer to ``text``, chunk by chunk (checked before anything is generated)."""
        problem = text_problem(text)
        if problem:
            raise ValueError(f"the message {problem}")
        prompt, kept = self._fit_prompt([*self.messages, {"role": "user", "content": text}])
        return self._answer(prompt, kept)

    def ask(self, text: str) -> str:
        """The whole answer to ``text``."""
        return "".join(self.send(text))

    def _answer(self, prompt: list[int], kept: list[dict]) -> Iterator[str]:
        stream = TextStream(self.model, self.tokenizer, prompt, self.params)
        yield from stream
        self.messages = [*kept, {"role": "assistant", "content": stream.text}]

    def _fit_prompt(self, messages: list[dict]) -> tuple[list[int], list[dict]]:
        """The prompt of the newest messages that leave ``max_new_tokens`` of context, and
        those messages (``messages`` itself is not changed)."""
        context = context_length(self.model)
        budget = context - self.params.max_new_tokens
        first = 1 if messages[0]["role"] == "system" else 0
        while True:
            prompt = encode_chat(self.tokenizer, messages, add_generation_prompt=True)
            if len(prompt) <= budget:
                return prompt, messages
            if len(messages) - first <= 1:
                raise ValueError(
                    f"the message is too long: the prompt would be {len(prompt)} tokens and the "
                    f"answer up to {self.params.max_new_tokens} more, but the model's context is "
                    f"{context} tokens")
            messages = messages[:first] + messages[first + 1:]  # the oldest turn goes first


def _command_loop(read: Callable[[str], str], out: TextIO, reset: Callable[[], None],
                  answer: Callable[[str], None]) -> None:
    """The terminal chat's input loop: ``/exit`` (or Ctrl-D) quits, ``/reset`` calls ``reset``,
    any other line (stripped) goes to ``answer``."""
    while True:
        try:
            text = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            reset()
            out.write("(conversation cleared)\n")
        else:
            answer(text)


def chat_loop(session: ChatSession, read: Callable[[str], str] = input,
              out: TextIO = sys.stdout) -> None:
    """The interactive chat of ``python -m minimind_lib chat``: answers stream to ``out`` as
    they are generated; ``/reset`` forgets the conversation, ``/exit`` (or Ctrl-D) quits.
    A message that cannot be sent is reported and the conversation goes on; Ctrl-C during an
    answer stops that answer (the turn is forgotten)."""
    def answer(text: str) -> None:
        if not text:
            return
        try:
            stream = session.send(text)
        except ValueError as e:
            out.write(f"(not sent: {e})\n")
            return
        out.write("minimind> ")
        try:
            for piece in stream:
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            out.write(" (interrupted)")
        out.write("\n")

    out.write("Chat with MiniMind. /reset starts over, /exit quits.\n")
    _command_loop(read, out, session.reset, answer)


def tool_chat_loop(model: nn.Module, tokenizer: BPETokenizer, *, tools: bool = True,
                   think: bool = False, system: str | None = None, max_new_tokens: int = 256,
                   temperature: float = 0.0, read: Callable[[str], str] = input,
                   out: TextIO = sys.stdout) -> None:
    """``python -m minimind_lib chat --tools`` / ``--think``: each message is answered by
    ``tools.run_with_tools`` (the course's tools, run by the safe executor; none without
    ``tools``), with thinking on when ``think``; the reasoning, each call and its result are
    shown before the answer. ``/reset`` and ``/exit`` as in ``chat_loop``."""
    schemas = tool_schemas() if tools else []
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)

    def reset() -> None:
        messages[:] = start

    def answer(text: str) -> None:
        problem = text_problem(text) if text else "is empty"
        if problem:
            out.write(f"(not sent: the message {problem})\n")
            return
        run = run_with_tools(model, tokenizer, [*messages, {"role": "user", "content": text}],
                             schemas, open_thinking=think, max_new_tokens=max_new_tokens,
                             temperature=temperature)
        for message in run.messages[len(messages) + 1:]:
            if message["role"] == "tool":
                out.write(f"  result: {message['content']}\n")
                continue
            if message.get("reasoning_content"):
                out.write(f"  (thinking) {message['reasoning_content']}\n")
            for call in message.get("tool_calls", ()):
                arguments = json.dumps(call["arguments"], ensure_ascii=False)
                out.write(f"  call: {call['name']}({arguments})\n")
            if message["content"]:
                out.write(f"minimind> {message['content']}\n")
        for error in run.errors:
            out.write(f"  ({error})\n")
        messages[:] = run.messages

    out.write(f"Chat with MiniMind ({'tools' if tools else 'no tools'}, thinking "
              f"{'on' if think else 'off'}). /reset starts over, /exit quits.\n")
    _command_loop(read, out, reset, answer)
