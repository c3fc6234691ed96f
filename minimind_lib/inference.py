"""Talk to a model: sampling parameters, text streaming and a chat session (notebook 08).

Two layers over ``MiniMindForCausalLM.stream`` (the one generation loop):

* ``TextStream``: token ids → text chunks.  A token may hold part of a UTF-8 character
  (byte-level BPE), so bytes go through an incremental UTF-8 decoder and a chunk is emitted
  only once its characters are complete.  Stops at a stop token (``<|im_end|>`` in chat).
* ``ChatSession``: a conversation in MiniMind's ChatML (``python -m minimind_lib chat``).

``minimind_lib.serve`` puts the same streams behind an OpenAI-compatible HTTP API.

>>> SamplingParams(temperature=-1)
Traceback (most recent call last):
...
ValueError: temperature must be >= 0, got -1
"""

from __future__ import annotations

import codecs
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
from torch import nn

from minimind_lib.checkpoint import load_model
from minimind_lib.device import pick_device
from minimind_lib.files import TOKENIZER_FILE
from minimind_lib.tokenizer import END_OF_TEXT, IM_END, BPETokenizer, encode_chat, load_tokenizer

STOP_TOKENS = (IM_END, END_OF_TEXT)  # a chat reply ends at either

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

# --------------------------------------------------------------------------- loading a model


def find_tokenizer(model_dir: str | os.PathLike) -> BPETokenizer:
    """The tokenizer of a stage folder: its own ``tokenizer.json``, else the run's
    ``tokenizer`` stage beside it, else the course tokenizer (``data/tokenizer``)."""
    model_dir = Path(model_dir)
    for path in (model_dir / TOKENIZER_FILE, model_dir.parent / "tokenizer" / TOKENIZER_FILE):
        if path.is_file():
            return BPETokenizer.from_file(path)
    return load_tokenizer()


def load_for_serving(model_dir: str | os.PathLike,
                     device: str | torch.device | None = None) -> tuple[nn.Module, BPETokenizer]:
    """Model (fp32 or int8 folder) and tokenizer of ``model_dir``, ready to generate."""
    model = load_model(model_dir, device or pick_device())
    tokenizer = find_tokenizer(model_dir)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model "
                         f"only {model.config.vocab_size}")
    return model, tokenizer
