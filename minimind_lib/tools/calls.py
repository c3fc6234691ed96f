"""Reading a model's reply for tool calls (notebook 14): MiniMind-3 writes each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after its content. A block
that does not parse is reported (``ParsedReply.errors``), never raised: the text is the model's,
and a malformed call is one more thing to tell it.

>>> reply = parse_tool_calls('Let me compute.\\n<tool_call>\\n{"name": "calculate", '
...                          '"arguments": {"expression": "2+2"}}\\n</tool_call>')
>>> reply.content, reply.calls
('Let me compute.', [{'name': 'calculate', 'arguments': {'expression': '2+2'}}])
>>> parse_tool_calls("<tool_call>{oops</tool_call>").errors
['tool call 1 is not valid JSON (Expecting property name enclosed in double quotes)']
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from minimind_lib.tokenizer.special import THINK, THINK_END, TOOL_CALL, TOOL_CALL_END

MAX_CALL_CHARS = 4000  # one call's JSON; a longer block is refused unread
MAX_CALLS = 8  # per reply
_BLOCK = re.compile(re.escape(TOOL_CALL) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)",
                    re.DOTALL)


@dataclass
class ParsedReply:
    """A reply split into its reasoning, its text and its calls (``{"name", "arguments"}``
    with ``arguments`` a dict), plus a message per block that could not be read."""

    content: str
    calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reasoning: str = ""


def _call(block: str, k: int) -> dict:
    if len(block) > MAX_CALL_CHARS:
        raise ValueError(f"tool call {k} is longer than {MAX_CALL_CHARS} characters")
    try:
        call = json.loads(block)
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call {k} is not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"tool call {k} is JSON nested too deeply") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError(f"tool call {k} needs a \"name\" string")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            raise ValueError(f"tool call {k}: \"arguments\" is a string but not JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call {k}: \"arguments\" must be an object")
    return {"name": call["name"], "arguments": arguments}


def parse_tool_calls(text: str) -> ParsedReply:
    """``text`` (a reply, decoded with its markers) as content, reasoning and calls; a think
    block (``<think>...</think>``) at the start is the reasoning."""
    reasoning = ""
    if THINK_END in text:
        head, _, text = text.partition(THINK_END)
        reasoning = head.split(THINK, 1)[-1].strip("\n")
    reply = ParsedReply(content=_BLOCK.sub("", text).strip(), reasoning=reasoning)
    for k, match in enumerate(_BLOCK.finditer(text), start=1):
        if k > MAX_CALLS:
            reply.errors.append(f"more than {MAX_CALLS} tool calls in one reply; the rest "
                                "were ignored")
            break
        try:
            reply.calls.append(_call(match.group(1).strip(), k))
        except ValueError as e:
            reply.errors.append(str(e))
    return reply
