"""Grammars for what a chat model writes (notebook 18): a JSON value under a schema, or tool
calls in MiniMind-3's format, as token-level constraints that ``generate``, ``generate_many``
and the server's batch apply row by row.

A reply is more than its JSON: MiniMind-3 opens it with a think block, and wraps each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` where the two markers are
single special tokens. So the grammar is built over symbols (bytes, plus ``Special(id)`` for a
marker) and compiled once per schema and vocabulary (``Constraint``; cached).

>>> from minimind_lib.tokenizer import load_tokenizer
>>> tok = load_tokenizer()
>>> c = constrain({"type": "object", "properties": {"ok": {"type": "boolean"}},
...                "required": ["ok"]}, tok)
>>> row = c.start()
>>> for t in tok.encode('{"ok": true}'):
...     row.advance(t)
>>> [tok.id_to_token(t) for t in c.index.allowed(row.state)]   # only a stop token is left
['<|endoftext|>', '<|im_end|>']
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from minimind_lib.inference.structured.automaton import (
    MAX_CODE_POINT,
    Alt,
    Chars,
    Concat,
    Repeat,
    Special,
    compile_tree,
    literal,
    parse_regex,
)
from minimind_lib.inference.structured.index import GrammarState, TokenIndex, TokenVocabulary
from minimind_lib.inference.structured.schema import WHITESPACE, SchemaError, schema_to_regex
from minimind_lib.tokenizer.special import THINK_END, TOOL_CALL, TOOL_CALL_END

ANY_TEXT = Repeat(Chars(((0, MAX_CODE_POINT),)), 0, None)  # any characters, no markers
_CACHE_SIZE = 64


@dataclass
class Constraint:
    """A compiled grammar over one vocabulary: ``start()`` gives a row its ``GrammarState``."""

    index: TokenIndex
    description: str

    def start(self) -> GrammarState:
        return GrammarState(self.index)

    @property
    def build_seconds(self) -> float:
        return self.index.build_seconds

    @property
    def num_states(self) -> int:
        return self.index.num_states


_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_constraints: OrderedDict = OrderedDict()


def vocabulary(tokenizer) -> TokenVocabulary:
    """The tokenizer's ``TokenVocabulary`` (built once per tokenizer object)."""
    if tokenizer not in _vocabularies:
        _vocabularies[tokenizer] = TokenVocabulary.from_tokenizer(tokenizer)
    return _vocabularies[tokenizer]


def _compiled(tokenizer, key: str, build) -> Constraint:
    vocab = vocabulary(tokenizer)
    cache_key = (id(vocab), key)
    if cache_key in _constraints:
        _constraints.move_to_end(cache_key)
        return _constraints[cache_key]
    constraint = Constraint(TokenIndex(compile_tree(build()), vocab), key)
    _constraints[cache_key] = constraint
    while len(_constraints) > _CACHE_SIZE:
        _constraints.popitem(last=False)
    return constraint


def _special(tokenizer, text: str) -> Special:
    if not tokenizer.reserves(text):
        raise ValueError(f"this tokenizer has no {text} token; constrained tool calls need "
                         "MiniMind-3's markers")
    return Special(tokenizer.token_to_id(text))


def _after_thinking(tokenizer, body, thinking: bool):
    """``body``, after the reasoning when the prompt opened a think block."""
    if not thinking:
        return body
    return Concat((ANY_TEXT, _special(tokenizer, THINK_END), Repeat(literal("\n"), 0, 2), body))


def constrain(schema: object, tokenizer, *, thinking: bool = False,
              whitespace: str = WHITESPACE) -> Constraint:
    """The reply is one JSON value valid under ``schema`` (``SchemaError`` outside the
    subset); ``thinking``: after the reasoning of a prompt that opened ``<think>``."""
    return constrain_reply(tokenizer, schema=schema, thinking=thinking, whitespace=whitespace)


def call_schema(tools: Sequence[dict]) -> dict:
    """The JSON Schema of one call to one of ``tools`` (OpenAI function schemas): its name
    and, for that name, arguments valid under the tool's parameters."""
    options = []
    for tool in tools:
        function = tool.get("function", tool)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "required": ["name", "arguments"], "properties": {
            "name": {"const": function["name"]}, "arguments": parameters}})
    return {"anyOf": options}


def constrain_tool_calls(tools: Sequence[dict], tokenizer, *, required: bool = True,
                         thinking: bool = False, parallel: bool = True) -> Constraint:
    """Replies in MiniMind-3's format whose calls name one of ``tools`` with valid arguments.

    ``required``: the reply is one or more calls and nothing else (``tool_choice`` "required"
    or a named function); otherwise free text, then any calls (``auto`` with strict tools).
    ``parallel=False``: at most one call. A tool whose parameters fall outside the subset is a
    ``SchemaError`` naming it (``tools[i].function.parameters...``).
    """
    return constrain_reply(tokenizer, tools=tools, tools_required=required, thinking=thinking,
                           parallel=parallel)


def tool_grammar(tokenizer) -> Callable[[Sequence[dict], bool], Constraint]:
    """For ``tools.run_with_tools(..., constrain=tool_grammar(tok))``: strict tools under
    ``auto`` (free text, then calls that parse and fit their schemas)."""
    def grammar(tools: Sequence[dict], thinking: bool) -> Constraint:
        return constrain_tool_calls(tools, tokenizer, required=False, thinking=thinking)
    return grammar


def constrain_reply(tokenizer, *, schema: object = None, tools: Sequence[dict] = (),
                    tools_required: bool = False, thinking: bool = False,
                    parallel: bool = True, whitespace: str = WHITESPACE) -> Constraint:
    """The one grammar of a reply, as the server asks for it.

    * ``schema`` alone: the reply is that JSON value;
    * ``tools`` with ``tools_required``: one or more calls (one with ``parallel=False``);
    * ``tools`` otherwise: with a schema, the JSON value or calls; without, any text then
      any calls;
    * ``thinking``: all of it after the reasoning and ``</think>``.
    """
    tools = list(tools or [])
    if schema is None and not tools:
        raise ValueError("a reply grammar needs a schema or tools")
    key = json.dumps(["reply", schema, tools, tools_required, thinking, parallel, whitespace],
                     sort_keys=True)

    def build():  # only on a cache miss: a schema seen before is neither checked nor compiled
        body = None if schema is None else parse_regex(schema_to_regex(schema, whitespace))
        if tools:
            for i, tool in enumerate(tools):  # each alone first: an error names its tool
                try:
                    schema_to_regex(call_schema([tool]), whitespace)
                except SchemaError as e:
                    path = e.path.replace("$.anyOf[0].arguments",
                                          f"tools[{i}].function.parameters")
                    raise SchemaError(e.keyword, path, str(e).split(": ", 1)[1]) from None
            pattern = "\n" + schema_to_regex(call_schema(tools), whitespace) + "\n"
            call = Concat((_special(tokenizer, TOOL_CALL), parse_regex(pattern),
                           _special(tokenizer, TOOL_CALL_END)))
            calls = call if not parallel else Concat(
                (call, Repeat(Concat((literal("\n"), call)), 0, None)))
            if tools_required:
                body = calls
            elif body is not None:
                body = Alt((body, calls))
            else:
                body = Concat((ANY_TEXT, Alt((Concat(()), calls))))
        return _after_thinking(tokenizer, body, thinking)

    return _compiled(tokenizer, key, build)
