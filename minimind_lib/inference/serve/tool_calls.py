"""Tool calling and thinking over the OpenAI API (notebook 14): what a request's ``tools``,
``tool_choice`` and thinking switches mean for the prompt, and how the model's text becomes
OpenAI's reply: ``reasoning_content``, ``content`` and ``tool_calls``.

``ReplySplitter`` reads the text as it streams, so the streamed deltas and the plain reply are
the same parse: reasoning up to ``</think>`` (only when the prompt opened the think block),
then content, and each ``<tool_call>...</tool_call>`` block that parses and names an offered
tool becomes a call with an id. A block that does not parse, or names a tool the request did
not offer, stays in the content as the text the model wrote: never a 500, and never a call
the client did not ask for.

>>> s = ReplySplitter({"calculate"}, thinking=False)
>>> deltas = s.feed('Sure.\\n<tool_call>\\n{"name": "calculate", "arguments": {"expression": '
...                 '"2+2"}}\\n</tool_call>') + s.finish()
>>> [list(d) for d in deltas], s.calls[0]["function"]["arguments"]
([['content'], ['tool_calls']], '{"expression": "2+2"}')
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from minimind_lib.tokenizer.special import THINK_END, TOOL_CALL, TOOL_CALL_END
from minimind_lib.tools.calls import MAX_CALLS, parse_tool_calls


def choose_tools(tools: Sequence[dict] | None, tool_choice: object) -> list[dict]:
    """The schemas the prompt offers: all of ``tools`` (``auto``, ``required``, or no choice),
    none (``"none"``), or the one a named choice picks; ``ValueError`` naming the problem
    (a choice of the wrong shape, a name not offered, ``required`` without tools).

    >>> tools = [{"type": "function", "function": {"name": "calculate"}}]
    >>> [t["function"]["name"] for t in choose_tools(tools, {"type": "function",
    ...                                                      "function": {"name": "calculate"}})]
    ['calculate']

    A choice of the wrong shape (OpenAI's form wants an object under "function"):

    >>> choose_tools(tools, {"type": "function", "function": "calculate"})
    Traceback (most recent call last):
    ValueError: tool_choice must be "auto", "none", "required" or {"type": "function", ...
    """
    tools = list(tools or [])
    if tool_choice in (None, "auto"):
        return tools
    if tool_choice == "none":
        return []
    if tool_choice == "required":
        if not tools:
            raise ValueError("tool_choice \"required\" needs tools")
        return tools
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (not isinstance(tool_choice, dict) or tool_choice.get("type") != "function"
            or not isinstance(name, str)):
        raise ValueError("tool_choice must be \"auto\", \"none\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r:.60}, which is not among the tools")
    return chosen


def _held_back(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a marker."""
    for k in range(min(len(text), max(len(m) for m in markers) - 1), 0, -1):
        if any(m.startswith(text[-k:]) for m in markers):
            return k
    return 0


class ReplySplitter:
    """The model's text (fed in pieces) as OpenAI deltas: ``{"reasoning_content": ...}``,
    ``{"content": ...}``, ``{"tool_calls": [...]}``. Afterwards ``reasoning``, ``content`` and
    ``calls`` (OpenAI's form, with ids) hold the whole reply."""

    def __init__(self, offered: set[str], thinking: bool) -> None:
        self.offered = offered
        self.state = "reasoning" if thinking else "content"
        self.pending = ""
        self.reasoning, self.content = "", ""
        self.calls: list[dict] = []
        self._spaces = ""  # content's trailing whitespace, sent once text follows it
        self._strip = False  # drop leading whitespace (after </think> or a call)
        self._newlines = ""  # reasoning's trailing newlines, likewise

    def feed(self, text: str) -> list[dict]:
        self.pending += text
        out: list[dict] = []
        while True:
            before = (self.state, len(self.pending))
            out += self._step()
            if (self.state, len(self.pending)) == before:
                return out

    def finish(self) -> list[dict]:
        """The deltas of what was held back (an unclosed call is content)."""
        out = self.feed("")
        if self.state == "call":
            out += self._text(TOOL_CALL + self.pending)
        elif self.state == "reasoning":  # never closed: all of it was thinking
            out += self._think(self.pending)
        else:
            out += self._text(self.pending)
        if self._spaces and not self.calls:  # a plain reply comes back verbatim
            self.content += self._spaces
            out.append({"content": self._spaces})
        self.pending, self.state = "", "done"
        return out

    def _think(self, text: str) -> list[dict]:
        """Reasoning text; its trailing newlines wait for more (the template's newline before
        ``</think>`` is not part of it)."""
        text = self._newlines + text
        text = text.lstrip("\n") if not self.reasoning else text
        body = text.rstrip("\n")
        self._newlines = text[len(body):]
        self.reasoning += body
        return [{"reasoning_content": body}] if body else []

    def _text(self, text: str) -> list[dict]:
        text = self._spaces + text
        if self._strip:
            text = text.lstrip()
            self._strip = not text
        body = text.rstrip()
        self._spaces = text[len(body):]
        self.content += body
        return [{"content": body}] if body else []

    def _step(self) -> list[dict]:
        p = self.pending
        if self.state == "reasoning":
            if THINK_END in p:
                head, _, self.pending = p.partition(THINK_END)
                self.state, self._strip = "content", True
                out = self._think(head)
                self._newlines = ""
                return out
            keep = _held_back(p, [THINK_END])
            self.pending = p[len(p) - keep:]
            return self._think(p[:len(p) - keep])
        if self.state == "content":
            if TOOL_CALL in p:
                head, _, self.pending = p.partition(TOOL_CALL)
                self.state = "call"
                out = self._text(head)
                self._spaces = ""  # the newline before the call is the template's
                return out
            keep = _held_back(p, [TOOL_CALL])
            self.pending = p[len(p) - keep:]
            return self._text(p[:len(p) - keep])
        if self.state == "call" and TOOL_CALL_END in p:
            block, _, self.pending = p.partition(TOOL_CALL_END)
            self.state = "content"
            out = self._call(block)
            self._strip = bool(self.calls)
            return out
        return []

    def _call(self, block: str) -> list[dict]:
        raw = TOOL_CALL + block + TOOL_CALL_END
        parsed = parse_tool_calls(raw)
        if parsed.errors or not parsed.calls or parsed.calls[0]["name"] not in self.offered \
                or len(self.calls) >= MAX_CALLS:
            return self._text(raw)  # not a call the client asked for: the model's text
        call = parsed.calls[0]
        entry = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                 "function": {"name": call["name"],
                              "arguments": json.dumps(call["arguments"], ensure_ascii=False)}}
        self.calls.append(entry)
        return [{"tool_calls": [{"index": len(self.calls) - 1, **entry}]}]

    def message(self) -> dict:
        """The whole reply as OpenAI's assistant message."""
        message: dict = {"role": "assistant", "content": self.content or
                         (None if self.calls else "")}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        return message

    def finish_reason(self, text_reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" when the reply called (and stopped by itself)."""
        return "tool_calls" if self.calls and text_reason == "stop" else text_reason
