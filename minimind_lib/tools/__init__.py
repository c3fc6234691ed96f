"""The course's tools (notebook 14): what a model may call, run safely, and how its calls are
read back from the text it writes.

* ``registry``: ``tool_schemas()`` (OpenAI function schemas) and ``execute_tool(name,
  arguments)``, the safe executor: arguments are data checked against the schema, and every
  refusal is the JSON message the model reads, never an exception;
* ``arithmetic``: the calculator, a hand-walked parse tree with limits (never ``eval``);
* ``measures``: unit conversion and date arithmetic; ``lookup``: a poem's author from the
  bundled poems;
* ``calls``: ``parse_tool_calls``, the ``<tool_call>`` blocks of a reply (malformed ones are
  reported, not raised);
* ``loop``: ``run_with_tools(model, tokenizer, messages, tools, max_rounds)``, generate, read
  the calls, run them, continue (a ``ToolRun`` transcript).

A layer of its own, between ``data`` and ``evaluation``: evaluation scores calls and the
trainers roll them out, so both import it (``docs/architecture.md``).

>>> from minimind_lib.tools import execute_tool, parse_tool_calls
>>> call = parse_tool_calls('<tool_call>{"name": "weekday", "arguments": '
...                         '{"date": "2026-04-01"}}</tool_call>').calls[0]
>>> execute_tool(call["name"], call["arguments"])
'{"result": "Wednesday"}'
"""

from minimind_lib.tools.calls import ParsedReply, parse_tool_calls
from minimind_lib.tools.loop import ToolRun, run_with_tools
from minimind_lib.tools.registry import TOOLS, execute_tool, tool_schemas

__all__ = ["TOOLS", "ParsedReply", "ToolRun", "execute_tool", "parse_tool_calls",
           "run_with_tools", "tool_schemas"]
