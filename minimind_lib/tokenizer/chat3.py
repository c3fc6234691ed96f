"""MiniMind-3's chat template (notebooks 01 and 05), written out in Python.

What it renders, character for character as MiniMind-3's ``tokenizer_config.json`` template
does through ``transformers`` (``tests/test_chat3.py`` compares the two):

* with ``tools``, the system turn carries a ``# Tools`` block listing each tool as JSON
  between ``<tools></tools>`` and the ``<tool_call>`` calling convention (after the first
  system message's content, when there is one); no default system turn otherwise;
* every assistant turn opens with a think block ``<think>\\n...\\n</think>\\n\\n``, from the
  message's ``reasoning_content`` or split out of its content at ``</think>`` (empty when
  neither), then the content, then one ``<tool_call>\\n{"name": ..., "arguments": ...}\\n
  </tool_call>`` per call;
* consecutive ``tool`` messages become one user turn of ``<tool_response>`` blocks;
* the generation prompt opens the reply: ``<think>\\n`` with ``open_thinking``, else an empty
  think block (the model answers directly).

``normalise_messages`` accepts MiniMind's data as it is on disk (``tools`` and ``tool_calls``
as JSON strings or lists, OpenAI's nested ``{"type": "function", "function": {...}}`` calls
or flat ``{"name", "arguments"}`` ones, ``arguments`` as an object or a JSON string) and
names the field of anything malformed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from minimind_lib.tokenizer.special import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
)

CHAT3_ROLES = ("system", "user", "assistant", "tool")

#: A piece of the rendering: (text, is it one special marker, is it part of an assistant reply)
Piece = tuple[str, bool, bool]


def _json_value(value: object, field: str) -> object:
    """``value`` itself, or the JSON it spells when it is a string."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{field} is a string but not valid JSON ({e.msg} at column "
                         f"{e.colno})") from None
    except RecursionError:
        raise ValueError(f"{field} is JSON nested too deeply to read") from None


def _tool_call(call: object, field: str) -> dict:
    """One call as ``{"name": str, "arguments": dict | str}`` (a string kept verbatim, as the
    template writes it), from OpenAI's nested form or the flat one."""
    if not isinstance(call, dict):
        raise ValueError(f"{field} must be an object, got {type(call).__name__}")
    if call.get("function"):  # OpenAI: {"type": "function", "function": {...}}
        call, field = call["function"], f"{field}.function"
        if not isinstance(call, dict):
            raise ValueError(f"{field} must be an object, got {type(call).__name__}")
    if not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError(f"{field}.name must be a non-empty string, got {call.get('name')!r}")
    if "arguments" not in call:
        raise ValueError(f"{field} has no 'arguments'")
    arguments = call["arguments"]
    if isinstance(arguments, str):
        parsed = _json_value(arguments, f"{field}.arguments")
        if not isinstance(parsed, dict):
            raise ValueError(f"{field}.arguments must spell a JSON object, got "
                             f"{type(parsed).__name__}")
    elif not isinstance(arguments, dict):
        raise ValueError(f"{field}.arguments must be an object or a JSON string, got "
                         f"{type(arguments).__name__}")
    return {"name": call["name"], "arguments": arguments}


def _tool_list(value: object, field: str) -> list[dict]:
    tools = _json_value(value, field)
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"{field} must be a list of tool objects (or its JSON string)")
    return tools


def _optional_text(message: dict, key: str, field: str) -> str | None:
    value = message.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{field}.{key} must be a string, got {type(value).__name__}")
    return value


def normalise_messages(messages: Sequence[object], field: str = "messages"
                       ) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` ready to render: each message ``{"role", "content"}`` plus
    ``reasoning_content`` and ``tool_calls`` (parsed) where given; ``tools`` from a system
    message's ``tools`` (the last one that has them), or None.

    >>> msgs, tools = normalise_messages([
    ...     {"role": "system", "content": "", "tools": '[{"name": "add"}]'},
    ...     {"role": "assistant", "content": None,
    ...      "tool_calls": '[{"name": "add", "arguments": "{\\\\"a\\\\": 1}"}]'}])
    >>> tools, msgs[1]["tool_calls"], msgs[1]["content"]
    ([{'name': 'add'}], [{'name': 'add', 'arguments': '{"a": 1}'}], '')
    >>> normalise_messages([{"role": "tool", "content": 3}])
    Traceback (most recent call last):
    ...
    ValueError: messages[0].content must be a string, got int
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"{field} must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError(f"{field} is an empty conversation")
    out: list[dict] = []
    tools = None
    for i, m in enumerate(messages):
        where = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where} must be an object with 'role' and 'content'")
        if m.get("role") not in CHAT3_ROLES:
            raise ValueError(f"{where}.role is {m.get('role')!r}; expected one of "
                             f"{', '.join(CHAT3_ROLES)}")
        message = {"role": m["role"], "content": m.get("content")}
        calls = m.get("tool_calls")
        if message["content"] is None and m["role"] == "assistant" and calls:
            message["content"] = ""  # OpenAI's tool-calling reply has content null
        if not isinstance(message["content"], str):
            raise ValueError(f"{where}.content must be a string, got "
                             f"{type(message['content']).__name__}")
        reasoning = _optional_text(m, "reasoning_content", where)
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls not in (None, "", []):
            if m["role"] != "assistant":
                raise ValueError(f"{where} has tool_calls but role {m['role']!r}; only an "
                                 "assistant calls tools")
            calls = _json_value(calls, f"{where}.tool_calls")
            if not isinstance(calls, list):
                raise ValueError(f"{where}.tool_calls must be a list of calls (or its JSON "
                                 f"string), got {type(calls).__name__}")
            message["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]")
                                     for k, c in enumerate(calls)]
        if m.get("tools") not in (None, "", []):
            if m["role"] != "system":
                raise ValueError(f"{where} has tools but role {m['role']!r}; tools go on the "
                                 "system message")
            tools = _tool_list(m["tools"], f"{where}.tools")
        out.append(message)
    return out, tools


def offers_tools(messages: Sequence[object]) -> bool:
    """Whether a conversation's system turn carries tool schemas (MiniMind's ``tools`` key).

    >>> offers_tools([{"role": "system", "content": "", "tools": '[{"name": "add"}]'}])
    True
    """
    return any(isinstance(m, dict) and m.get("tools") not in (None, "", []) for m in messages)


def reserves_markers(tokenizer: object) -> bool:
    """Whether a tokenizer reserves MiniMind-3's ``<think>`` and ``<tool_call>`` (so its model
    speaks MiniMind-3's format: ``chat.template_of``)."""
    return tokenizer.reserves(THINK) and tokenizer.reserves(TOOL_CALL)


def jinja_template_of(tokenizer: object) -> str:
    """The Jinja chat template an exported tokenizer_config.json or GGUF carries for the format
    ``tokenizer``'s model speaks (``MINIMIND3_CHAT_TEMPLATE`` or MiniMind2's ``CHAT_TEMPLATE``),
    so ``transformers`` and llama.cpp render as ``apply_chat_template`` does."""
    return MINIMIND3_CHAT_TEMPLATE if reserves_markers(tokenizer) else CHAT_TEMPLATE


def _tojson(value: object) -> str:
    """What the template's ``tojson`` filter writes (``transformers``' own: no ASCII escapes)."""
    return json.dumps(value, ensure_ascii=False)


#: The tools block's fixed text (between the tool list and the markers it names).
TOOLS_INTRO = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n"
               "<tools>")
TOOLS_CONVENTION = ("\n</tools>\n\nFor each function call, return a json object with function "
                    "name and arguments within ")
TOOLS_TAGS = " XML tags:\n"
CALL_SHAPE = '\n{"name": <function-name>, "arguments": <args-json-object>}\n'


def _tools_block(system: str | None, tools: Sequence[dict]) -> list[Piece]:
    head = (system + "\n\n" if system is not None else "") + TOOLS_INTRO
    listing = "".join("\n" + _tojson(t) for t in tools)
    return [(IM_START, True, False), ("system\n" + head + listing + TOOLS_CONVENTION, False, False),
            (TOOL_CALL, True, False), (TOOL_CALL_END, True, False),
            (TOOLS_TAGS, False, False), (TOOL_CALL, True, False),
            (CALL_SHAPE, False, False), (TOOL_CALL_END, True, False), (IM_END, True, False),
            ("\n", False, False)]


def split_reasoning(message: dict) -> tuple[str, str]:
    """``(reasoning, content)`` of an assistant message, as the template reads them: the
    ``reasoning_content`` field, else what stands before ``</think>`` in the content.

    >>> split_reasoning({"role": "assistant", "content": "<think>\\n2+2\\n</think>\\n\\n4"})
    ('2+2', '4')
    """
    content = message["content"]
    if isinstance(message.get("reasoning_content"), str):
        return message["reasoning_content"], content
    if THINK_END in content:
        reasoning = content.split(THINK_END)[0].rstrip("\n").split(THINK)[-1].lstrip("\n")
        return reasoning, content.split(THINK_END)[-1].lstrip("\n")
    return "", content


def _assistant(message: dict) -> list[Piece]:
    reasoning, content = split_reasoning(message)
    # an empty think block is what the generation prompt holds when thinking is off: context,
    # like the prompt, not a target (supervised, a small model learns to reopen it: see below)
    thought = bool(reasoning.strip("\n"))
    pieces: list[Piece] = [(IM_START, True, False), ("assistant\n", False, False),
                           (THINK, True, thought),
                           ("\n" + reasoning.strip("\n") + "\n", False, thought),
                           (THINK_END, True, thought), ("\n\n" + content.lstrip("\n"), False, True)]
    for k, call in enumerate(message.get("tool_calls", ())):
        arguments = call["arguments"]
        pieces += [("\n" if (k == 0 and content) or k > 0 else "", False, True),
                   (TOOL_CALL, True, True),
                   ('\n{"name": "' + call["name"] + '", "arguments": '
                    + (arguments if isinstance(arguments, str) else _tojson(arguments))
                    + "}\n", False, True),
                   (TOOL_CALL_END, True, True)]
    return pieces + [(IM_END, True, True), ("\n", False, False)]


def _merged(pieces: Sequence[Piece]) -> list[Piece]:
    """Adjacent text pieces joined and empty ones dropped (the tokenizer sees the text between
    two markers as one string, as ``transformers`` does)."""
    out: list[Piece] = []
    for text, special, reply in pieces:
        if not special and not text:
            continue
        if out and not special and not out[-1][1]:
            out[-1] = (out[-1][0] + text, False, out[-1][2] and reply)
        else:
            out.append((text, special, reply))
    return out


def minimind3_pieces(messages: Sequence[object], add_generation_prompt: bool = False, *,
                     tools: Sequence[dict] | None = None,
                     open_thinking: bool = False) -> list[Piece]:
    """The rendering as ``(text, is_special, in_reply)`` pieces; ``in_reply`` marks what SFT
    supervises: the think block (when it holds reasoning), content and tool calls of every
    assistant turn and the ``<|im_end|>`` closing it. ``tools`` (a list of tool schemas)
    overrides a system message's.

    An empty think block is not supervised, unlike MiniMind-3's SFT: it is exactly the end of
    the thinking-off generation prompt, never written by the model; supervised, its six
    trivial tokens outnumber a short reply's and the smoke model learned to write ``<think>``
    again after the prompt's block (format rate 27% instead of 50-60%, measured).

    >>> [p[0] for p in minimind3_pieces([{"role": "user", "content": "2+2?"},
    ...                                  {"role": "assistant", "content": "4"}]) if p[2]]
    ['\\n\\n4', '<|im_end|>']
    >>> [p[0] for p in minimind3_pieces([{"role": "user", "content": "2+2?"}, {
    ...     "role": "assistant", "reasoning_content": "2+2=4", "content": "4"}]) if p[2]]
    ['<think>', '\\n2+2=4\\n', '</think>', '\\n\\n4', '<|im_end|>']
    """
    messages, found = normalise_messages(messages)
    tools = found if tools is None else _tool_list(tools, "tools")
    first_system = messages[0]["content"] if messages[0]["role"] == "system" else None
    pieces: list[Piece] = []
    if tools:
        pieces += _tools_block(first_system, tools)
    elif first_system is not None:
        pieces += [(IM_START, True, False), ("system\n" + first_system, False, False),
                   (IM_END, True, False), ("\n", False, False)]
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if role == "user" or (role == "system" and i > 0):
            pieces += [(IM_START, True, False), (f"{role}\n{content}", False, False),
                       (IM_END, True, False), ("\n", False, False)]
        elif role == "assistant":
            pieces += _assistant(message)
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                pieces += [(IM_START, True, False), ("user", False, False)]
            pieces += [("\n", False, False), (TOOL_RESPONSE, True, False),
                       ("\n" + content + "\n", False, False), (TOOL_RESPONSE_END, True, False)]
            if i == len(messages) - 1 or messages[i + 1]["role"] != "tool":
                pieces += [(IM_END, True, False), ("\n", False, False)]
    if add_generation_prompt:
        pieces += [(IM_START, True, False), ("assistant\n", False, False), (THINK, True, False)]
        pieces += ([("\n", False, False)] if open_thinking else
                   [("\n\n", False, False), (THINK_END, True, False), ("\n\n", False, False)])
    return _merged(pieces)


def _q(text: str) -> str:
    """``text`` as a Jinja string literal."""
    return json.dumps(text, ensure_ascii=False)


#: The same format as a Jinja template, written for this course and saved in an exported
#: tokenizer_config.json and GGUF, so ``transformers``' ``apply_chat_template`` (``tools=``,
#: ``open_thinking=``) and llama.cpp render what ``minimind3_pieces`` does
#: (``tests/test_chat3.py``).
MINIMIND3_CHAT_TEMPLATE = "".join([
    "{%- macro turn(role, text) -%}{{- ", _q(IM_START), " + role + '\\n' + text + ",
    _q(IM_END + "\n"), " -}}{%- endmacro -%}",
    "{%- set opens_with_system = messages and messages[0].role == 'system' -%}",
    "{%- if tools -%}{{- ", _q(IM_START + "system\n"), " -}}",
    "{%- if opens_with_system -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}",
    "{{- ", _q(TOOLS_INTRO), " -}}",
    "{%- for tool in tools -%}{{- '\\n' + tool | tojson -}}{%- endfor -%}",
    "{{- ", _q(TOOLS_CONVENTION + TOOL_CALL + TOOL_CALL_END + TOOLS_TAGS + TOOL_CALL + CALL_SHAPE
               + TOOL_CALL_END + IM_END + "\n"), " -}}",
    "{%- elif opens_with_system -%}{{- turn('system', messages[0].content) -}}{%- endif -%}",
    "{%- for m in messages -%}",
    "{%- set text = m.content if m.content is string else '' -%}",
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}",
    "{{- turn(m.role, text) -}}",
    "{%- elif m.role == 'assistant' -%}",
    "{%- set thought = '' -%}",
    "{%- if m.reasoning_content is string -%}{%- set thought = m.reasoning_content -%}",
    "{%- elif ", _q(THINK_END), " in text -%}",
    "{%- set thought = text.split(", _q(THINK_END), ")[0].rstrip('\\n').split(", _q(THINK),
    ")[-1].lstrip('\\n') -%}",
    "{%- set text = text.split(", _q(THINK_END), ")[-1].lstrip('\\n') -%}{%- endif -%}",
    "{{- ", _q(IM_START + "assistant\n" + THINK + "\n"), " + thought.strip('\\n') + ",
    _q("\n" + THINK_END + "\n\n"), " + text.lstrip('\\n') -}}",
    "{%- for call in m.tool_calls or [] -%}",
    "{%- set f = call.function if call.function is defined else call -%}",
    "{{- ('\\n' if (text or not loop.first) else '') + ", _q(TOOL_CALL + '\n{"name": "'),
    " + f.name + ", _q('", "arguments": '),
    " + (f.arguments if f.arguments is string else f.arguments | tojson) + ",
    _q("}\n" + TOOL_CALL_END), " -}}",
    "{%- endfor -%}{{- ", _q(IM_END + "\n"), " -}}",
    "{%- elif m.role == 'tool' -%}",
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- ", _q(IM_START + "user"),
    " -}}{%- endif -%}",
    "{{- ", _q("\n" + TOOL_RESPONSE + "\n"), " + text + ", _q("\n" + TOOL_RESPONSE_END), " -}}",
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- ", _q(IM_END + "\n"),
    " -}}{%- endif -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{- ", _q(IM_START + "assistant\n" + THINK + "\n"),
    " -}}{%- if not (open_thinking is defined and open_thinking) -%}{{- ",
    _q("\n" + THINK_END + "\n\n"), " -}}{%- endif -%}{%- endif -%}",
])
