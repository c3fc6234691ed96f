"""Structured outputs on the server (notebook 18), through the official ``openai`` client:
``response_format``, ``tool_choice`` "required" / named, ``strict`` tools, plain and streamed,
alone and in one batch; and the 400s that name the field."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from minimind_lib.inference.loading import find_tokenizer, load_model
from minimind_lib.inference.serve.app import create_app
from minimind_lib.inference.serve.launch import BackgroundServer
from minimind_lib.inference.structured import validate
from minimind_lib.tools import tool_schemas

openai = pytest.importorskip("openai", reason="the official client (the [dev] extra)")

REFERENCE = "data/reference/sft"
TOOLS = tool_schemas()
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
QUESTIONS = ["What is 37 * 48?", "How many days from 2024-01-05 to 2024-03-01?",
             "Convert 12 miles to km.", "What weekday was 1999-12-31?", "Who wrote 静夜思?"]
# every field bounded: a greedy reply always finishes inside the token budget
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"},
                         "size": {"enum": ["S", "M", "L"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                  "maxItems": 2}}}


@pytest.fixture(scope="module")
def server():
    model, tok = load_model(REFERENCE), find_tokenizer(REFERENCE)
    with BackgroundServer(create_app(model, tok, model_name="reference")) as s:
        yield s


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _ask(client, question, **kwargs):
    return client.chat.completions.create(
        model="reference", messages=[{"role": "user", "content": question}],
        **{"max_tokens": 160, "temperature": 0, **kwargs})


def _streamed(client, question, **kwargs):
    calls, content, finish = {}, "", None
    for chunk in _ask(client, question, stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
        content += delta.content or ""
        for call in delta.tool_calls or []:
            calls.setdefault(call.index, [call.function.name, ""])[1] += call.function.arguments
    return calls, content, finish


def _check_calls(calls, names):
    assert calls, "no call"
    for name, arguments in calls:
        assert name in names
        assert validate(json.loads(arguments), PARAMETERS[name]) == []


@pytest.mark.parametrize("choice", ["required", "named"])
def test_required_and_named_calls_always_parse_and_validate(client, choice):
    for k, question in enumerate(QUESTIONS):
        name = list(PARAMETERS)[k]
        tool_choice = ("required" if choice == "required"
                       else {"type": "function", "function": {"name": name}})
        names = set(PARAMETERS) if choice == "required" else {name}
        reply = _ask(client, question, tools=TOOLS, tool_choice=tool_choice)
        message = reply.choices[0].message
        # "length": the model kept adding calls (each complete) until max_tokens
        assert reply.choices[0].finish_reason in ("tool_calls", "length")
        assert not message.content
        _check_calls([(c.function.name, c.function.arguments) for c in message.tool_calls],
                     names)
        calls, content, finish = _streamed(client, question, tools=TOOLS,
                                           tool_choice=tool_choice)
        assert finish == reply.choices[0].finish_reason and content == ""
        _check_calls(list(calls.values()), names)
        assert [c[1] for c in calls.values()] == [c.function.arguments
                                                  for c in message.tool_calls]


def test_parallel_tool_calls_false_gives_one_call(client):
    for question in QUESTIONS:
        reply = _ask(client, question, tools=TOOLS, tool_choice="required",
                     parallel_tool_calls=False)
        assert reply.choices[0].finish_reason == "tool_calls"
        assert len(reply.choices[0].message.tool_calls) == 1


def test_strict_tools_under_auto_keep_calls_valid(client):
    strict = [{"type": "function", "function": {**t["function"], "strict": True}}
              for t in TOOLS]
    for question in QUESTIONS:
        message = _ask(client, question, tools=strict).choices[0].message
        _check_calls([(c.function.name, c.function.arguments)
                      for c in message.tool_calls or []] or [("calculate", "{\"expression\": "
                                                              "\"1\"}")], set(PARAMETERS))


def test_response_format_json_schema_and_json_object(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True,
                                                  "schema": PERSON}}
    for question in QUESTIONS[:3]:
        reply = _ask(client, question, response_format=fmt)
        assert reply.choices[0].finish_reason == "stop"
        assert validate(json.loads(reply.choices[0].message.content), PERSON) == []
        _, content, finish = _streamed(client, question, response_format=fmt)
        assert finish == "stop" and content == reply.choices[0].message.content
    reply = _ask(client, "Give me JSON.", response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:  # cut by max_tokens: what was written is still a prefix of an object
        assert reply.choices[0].message.content.startswith("{")


def test_concurrent_constrained_and_free_requests_share_the_batch(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    jobs = [dict(response_format=fmt), dict(tools=TOOLS, tool_choice="required"), dict(),
            dict(response_format=fmt, temperature=1.0, seed=3)] * 2
    with ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(lambda kw: _ask(client, QUESTIONS[0], **kw), jobs))
    for kw, reply in zip(jobs, replies, strict=True):
        message = reply.choices[0].message
        if "response_format" in kw:
            assert validate(json.loads(message.content), PERSON) == []
        elif "tools" in kw:
            _check_calls([(c.function.name, c.function.arguments) for c in message.tool_calls],
                         set(PARAMETERS))
    alone = _ask(client, QUESTIONS[0], response_format=fmt).choices[0].message.content
    assert replies[0].choices[0].message.content == alone


@pytest.mark.parametrize("request_fields, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "integer", "minimum": 3}}}}, "response_format.json_schema.schema", "minimum"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "xml"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
    ({"response_format": "json"}, "response_format", "type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "a+"}}}}}]},
     "tools[0].function.parameters", "pattern"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "nope"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": "calculate"}},
     "tool_choice", "tool_choice"),
])
def test_bad_structured_requests_are_400s_naming_the_field(client, request_fields, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, QUESTIONS[0], **request_fields)
    assert e.value.body["param"] == param and words in e.value.body["message"]


def test_max_tokens_below_what_the_grammar_needs_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        _ask(client, QUESTIONS[0], tools=TOOLS, tool_choice="required", max_tokens=3)
    assert e.value.body["param"] == "max_tokens" and "needs at least" in e.value.body["message"]
