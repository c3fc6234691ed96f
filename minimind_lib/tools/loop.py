"""The tool loop (notebook 14): the model answers; if its reply holds ``<tool_call>`` blocks,
each call runs through the safe executor and comes back as a ``tool`` message, and the model
answers again, until it replies without a call or ``max_rounds`` replies were written.

The conversation is rendered in MiniMind-3's format (``encode_chat`` with ``tools``), so the
model sees the schemas in its system turn and the results as ``<tool_response>`` blocks, as in
its SFT data. A call that cannot be read is reported back to the model as a tool message
too (it may try again); nothing in the reply is ever run but the named tool's own function.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import IM_END
from minimind_lib.tools.calls import parse_tool_calls
from minimind_lib.tools.registry import execute_tool, tool_schemas


@dataclass
class ToolRun:
    """What ``run_with_tools`` did: the whole conversation after the loop (the input, then each
    assistant reply and tool result, in MiniMind's message format), every call with its result,
    the read errors, and whether the last reply answered (no call) within ``max_rounds``."""

    messages: list[dict]
    calls: list[dict] = field(default_factory=list)  # {"name", "arguments", "result"}
    errors: list[str] = field(default_factory=list)
    rounds: int = 0
    answered: bool = False
    round_errors: list[int] = field(default_factory=list)  # read errors, per reply

    @property
    def answer(self) -> str:
        """The content of the last assistant reply ('' before any)."""
        replies = [m for m in self.messages if m["role"] == "assistant"]
        return replies[-1]["content"] if replies else ""


def _reply(model: nn.Module, tokenizer: BPETokenizer, prompt: list[int], max_new_tokens: int,
           temperature: float, generator: torch.Generator | None, grammar: object = None) -> str:
    """One reply's text, markers kept (``<think>``, ``<tool_call>``), up to ``<|im_end|>``."""
    end = tokenizer.token_to_id(IM_END)
    device = next(model.parameters()).device
    grammar_kw = {} if grammar is None else {"constraints": grammar}
    out = model.generate(torch.tensor([prompt], device=device), max_new_tokens,
                         temperature=temperature, eos_token_id=end, generator=generator,
                         **grammar_kw)
    new = out[0, len(prompt):].tolist()
    return tokenizer.decode(new[:new.index(end)] if end in new else new)


@torch.no_grad()
def run_with_tools(model: nn.Module, tokenizer: BPETokenizer, messages: Sequence[dict],
                   tools: Sequence[dict] | None = None, max_rounds: int = 4, *,
                   open_thinking: bool = False, max_new_tokens: int = 128,
                   temperature: float = 0.0, generator: torch.Generator | None = None,
                   execute: Callable[[str, dict], str] = execute_tool,
                   constrain: Callable[[list[dict], bool], object] | None = None) -> ToolRun:
    """Answer ``messages`` with the tools: generate, read the calls, run them, continue.

    ``tools`` are OpenAI function schemas (default: all of the course's, ``tool_schemas()``);
    ``execute(name, arguments) -> str`` runs one call (default: the safe executor, which runs
    only the course's tools and answers anything else with an error message).
    ``constrain(tools, open_thinking)``: the grammar every reply decodes under, so each call it
    writes parses and fits its tool's schema (``inference.structured.tool_grammar(tokenizer)``:
    free text, then valid calls; the model still decides whether to call, and what).
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be at least 1, got {max_rounds}")
    tools = list(tool_schemas() if tools is None else tools)
    run = ToolRun(messages=[dict(m) for m in messages])
    room = model.config.max_position_embeddings
    grammar = constrain(tools, open_thinking) if constrain is not None and tools else None
    was_training = model.training
    model.eval()
    try:
        while run.rounds < max_rounds:
            prompt = encode_chat(tokenizer, run.messages, True, tools=tools,
                                 open_thinking=open_thinking)
            if len(prompt) + max_new_tokens > room:
                run.errors.append(f"the conversation ({len(prompt)} tokens) leaves no room for "
                                  f"a {max_new_tokens}-token reply in {room}")
                break
            reply = parse_tool_calls(_reply(model, tokenizer, prompt, max_new_tokens,
                                            temperature, generator, grammar))
            run.rounds += 1
            run.round_errors.append(len(reply.errors))
            message = {"role": "assistant", "content": reply.content}
            if reply.reasoning:
                message["reasoning_content"] = reply.reasoning
            if reply.calls:
                message["tool_calls"] = reply.calls
            run.messages.append(message)
            run.errors += reply.errors
            if not reply.calls and not reply.errors:
                run.answered = True
                break
            for call in reply.calls:
                result = execute(call["name"], call["arguments"])
                run.calls.append({**call, "result": result})
                run.messages.append({"role": "tool", "content": result})
            for error in reply.errors:  # tell the model what it wrote wrong
                run.messages.append({"role": "tool",
                                     "content": json.dumps({"error": error}, ensure_ascii=False)})
    finally:
        model.train(was_training)
    return run
