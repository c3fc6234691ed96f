"""Structured outputs over the OpenAI API (notebook 18): what ``response_format``,
``tool_choice``, ``tools[].function.strict`` and ``parallel_tool_calls`` ask of a reply, as the
one grammar its row decodes under (``inference.structured.constrain_reply``).

* ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": ...}}``: the reply is
  JSON valid under the schema (``strict`` or not: a small model's best effort is noise, so the
  grammar always holds); ``{"type": "json_object"}``: a JSON object; ``{"type": "text"}``: free.
* ``tool_choice`` ``"required"`` or a named function: the reply is calls (to that function) and
  nothing else, each naming an offered tool with arguments valid under its parameters;
  ``"auto"`` with any ``strict`` tool: free text, then calls under the grammar; ``"none"``: no
  tools in the prompt.

A schema outside the supported subset is a 400 naming the field and the keyword, as is a
request a grammar cannot serve (a model without the tool markers, a vision model).

>>> plan = reply_plan({"type": "json_object"}, [], None, None)
>>> plan.schema, plan.tools, plan.required
({'type': 'object'}, [], False)
>>> reply_plan(None, [], None, None) is None
True
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from minimind_lib.inference.serve.errors import BadRequest
from minimind_lib.inference.structured.grammar import Constraint, constrain_reply
from minimind_lib.inference.structured.schema import SchemaError


@dataclass
class ReplyPlan:
    """What the grammar of one reply holds: a JSON schema, tools (their calls required or
    not), and whether the calls may be several."""

    schema: object = None
    tools: list[dict] = field(default_factory=list)
    required: bool = False
    parallel: bool = True
    schema_param: str = "response_format"


def _response_schema(response_format: object) -> tuple[object, str] | None:
    """The JSON schema ``response_format`` asks for, and the field it came from; None: text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise BadRequest("response_format must be an object with a \"type\": \"text\", "
                         "\"json_object\" or \"json_schema\"", "response_format")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}, "response_format"
    if kind != "json_schema":
        raise BadRequest(f"response_format.type {kind!r:.40} is not one of text, json_object, "
                         "json_schema", "response_format.type")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest("response_format.json_schema must be an object holding a \"name\" "
                         "and a \"schema\"", "response_format.json_schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise BadRequest("response_format.json_schema.strict must be a boolean",
                         "response_format.json_schema.strict")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise BadRequest("response_format.json_schema.schema must be a JSON Schema object",
                         "response_format.json_schema.schema")
    return schema, "response_format.json_schema.schema"


def reply_plan(response_format: object, offered: Sequence[dict], tool_choice: object,
               parallel_tool_calls: bool | None,
               strict_names: Sequence[str] = ()) -> ReplyPlan | None:
    """The grammar a reply needs (None: the reply is free). ``offered`` are the tools the
    prompt shows (after ``tool_choice``), ``strict_names`` those sent with ``strict: true``."""
    wanted = _response_schema(response_format)
    required = bool(offered) and (tool_choice == "required" or isinstance(tool_choice, dict))
    constrained_tools = list(offered) if (required or any(
        t["function"]["name"] in strict_names for t in offered)) else []
    if wanted is None and not constrained_tools:
        return None
    schema, param = wanted if wanted is not None else (None, "response_format")
    return ReplyPlan(schema, constrained_tools, required, parallel_tool_calls is not False,
                     param)


def compile_plan(plan: ReplyPlan, tokenizer, thinking: bool) -> Constraint:
    """The plan's grammar over the tokenizer's vocabulary; ``BadRequest`` naming the field
    when a schema falls outside the subset or the tokenizer cannot write the format."""
    try:
        return constrain_reply(tokenizer, schema=plan.schema, tools=plan.tools,
                               tools_required=plan.required, thinking=thinking,
                               parallel=plan.parallel)
    except SchemaError as e:
        param = plan.schema_param if e.path.startswith("$") else e.path.split(".parameters")[0]
        if not e.path.startswith("$"):
            param += ".parameters"
        raise BadRequest(f"{e} (keyword {e.keyword!r})", param) from None
    except ValueError as e:
        raise BadRequest(f"structured output: {e}",
                         "tools" if plan.tools else plan.schema_param) from None


async def reply_constraint(req, offered: Sequence[dict], thinking: bool, tokenizer, *,
                           vision: bool = False) -> Constraint | None:
    """The grammar a ``ChatRequest`` asks for (None: none), compiled off the event loop (a new
    schema takes a fraction of a second; then it is cached)."""
    plan = reply_plan(req.response_format, offered, req.tool_choice, req.parallel_tool_calls,
                      [t.function.name for t in req.tools or [] if t.function.strict])
    if plan is None:
        return None
    if vision:
        raise BadRequest("structured outputs need a text model; the vision-language model "
                         "decodes without a grammar",
                         "tool_choice" if plan.tools else "response_format")
    return await asyncio.to_thread(compile_plan, plan, tokenizer, thinking)


def check_room(constraint: Constraint | None, max_new_tokens: int, param: str) -> None:
    """A 400 naming ``param`` when the budget is below the fewest tokens the grammar needs."""
    if constraint is not None and constraint.index.min_tokens > max_new_tokens:
        raise BadRequest(f"the reply's grammar needs at least {constraint.index.min_tokens} "
                         f"tokens; {param} is {max_new_tokens}", param)
