"""Tool calling and thinking over the server's OpenAI API, driven by the official ``openai``
client as users drive it: ``tools=[...]`` gets parsed ``tool_calls``, the ``tool`` result goes
back, the final answer comes out, plain and streamed; thinking comes back as
``reasoning_content``; what does not parse as an offered call is plain content, never a 500.
A scripted model writes chosen replies, so every branch is reached on purpose."""

from __future__ import annotations

import json

import httpx
import pytest
from tiny import ScriptedReplies

from minimind_lib.inference.serve.app import create_app
from minimind_lib.inference.serve.launch import BackgroundServer
from minimind_lib.inference.serve.tool_calls import ReplySplitter
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.tools import tool_schemas

openai = pytest.importorskip("openai", reason="the official client (pip install openai; the "
                                              "dev extra has it)")
TOK = load_tokenizer()
CALL = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "256 * 37"}}\n'
        '</tool_call>')


@pytest.fixture(scope="module")
def model():
    return ScriptedReplies(TOK)


@pytest.fixture(scope="module")
def server(model):
    with BackgroundServer(create_app(model, TOK, model_name="scripted")) as s:
        yield s


@pytest.fixture()
def client(server, model):
    model.replies.clear()
    model.prompts.clear()
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


QUESTION = [{"role": "user", "content": "What is 256 * 37?"}]


def test_the_official_client_gets_the_call_sends_the_result_and_gets_the_answer(client, model):
    model.replies += [CALL, "256 * 37 = 9472"]
    tools = tool_schemas(["calculate", "weekday"])
    first = client.chat.completions.create(model="scripted", messages=QUESTION, tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculate"
    assert json.loads(call.function.arguments) == {"expression": "256 * 37"}
    assert "<tools>" in model.prompts[0] and '"name": "weekday"' in model.prompts[0]

    result = json.dumps({"result": "9472"})
    second = client.chat.completions.create(model="scripted", tools=tools, messages=[
        *QUESTION, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result}])
    assert second.choices[0].message.content == "256 * 37 = 9472"
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    # the model saw its own call and the result, in MiniMind-3's blocks
    assert CALL in model.prompts[1]
    assert f"<tool_response>\n{result}\n</tool_response>" in model.prompts[1]


def test_streamed_tool_calls_and_the_answer(client, model):
    model.replies += ["Let me compute.\n" + CALL, "256 * 37 = 9472"]
    tools = tool_schemas(["calculate"])
    chunks = list(client.chat.completions.create(model="scripted", messages=QUESTION,
                                                 tools=tools, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me compute."
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "calculate"
    assert json.loads(calls[0].function.arguments) == {"expression": "256 * 37"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    answer = client.chat.completions.create(model="scripted", tools=tools, stream=True, messages=[
        *QUESTION, {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": calls[0].id, "type": "function", "function": {
                "name": "calculate", "arguments": calls[0].function.arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"result": "9472"}'}])
    assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices) \
        == "256 * 37 = 9472"


@pytest.mark.parametrize("switch", [{"chat_template_kwargs": {"enable_thinking": True}},
                                    {"chat_template_kwargs": {"open_thinking": True}},
                                    {"open_thinking": True}])
def test_thinking_comes_back_as_reasoning_content(client, model, switch):
    model.replies += ["3 + 4 = 7\n7 + 5 = 12\n</think>\n\n3 + 4 + 5 = 12"] * 2
    plain = client.chat.completions.create(model="scripted", messages=QUESTION, extra_body=switch)
    message = plain.choices[0].message
    assert model.prompts[0].endswith("<|im_start|>assistant\n<think>\n")  # the block is open
    assert message.content == "3 + 4 + 5 = 12"
    assert message.model_extra["reasoning_content"] == "3 + 4 = 7\n7 + 5 = 12"
    streamed = list(client.chat.completions.create(model="scripted", messages=QUESTION,
                                                   extra_body=switch, stream=True))
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) \
        == "3 + 4 = 7\n7 + 5 = 12"
    assert "".join(d.content or "" for d in deltas) == "3 + 4 + 5 = 12"


def test_thinking_off_by_default_closes_the_block(client, model):
    model.replies.append("12")
    reply = client.chat.completions.create(model="scripted", messages=QUESTION)
    assert model.prompts[0].endswith("<think>\n\n</think>\n\n")
    assert reply.choices[0].message.content == "12"
    assert "reasoning_content" not in (reply.choices[0].message.model_extra or {})


@pytest.mark.parametrize("reply", [
    '<tool_call>\n{"name": "calculate", "arguments": {oops}\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>',  # a tool not offered
    '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1+1"}}',  # never closed
])
def test_a_reply_that_is_not_an_offered_call_is_plain_content(client, model, reply):
    for stream in (False, True):
        model.replies.append(reply)
        response = client.chat.completions.create(
            model="scripted", messages=QUESTION, tools=tool_schemas(["calculate"]),
            stream=stream)
        if stream:
            chunks = list(response)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
            finish = chunks[-1].choices[0].finish_reason
        else:
            text, finish = response.choices[0].message.content, response.choices[0].finish_reason
            assert not response.choices[0].message.tool_calls
        assert text == reply and finish == "stop"


def test_tool_choice_none_and_named(client, model):
    model.replies += ["hi", "hi"]
    tools = tool_schemas(["calculate", "weekday"])
    client.chat.completions.create(model="scripted", messages=QUESTION, tools=tools,
                                   tool_choice="none")
    assert "<tools>" not in model.prompts[0]
    client.chat.completions.create(model="scripted", messages=QUESTION, tools=tools,
                                   tool_choice={"type": "function",
                                                "function": {"name": "weekday"}})
    assert '"name": "weekday"' in model.prompts[1] and '"name": "calculate"' not in \
        model.prompts[1]


def test_bad_tool_requests_are_400s_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:  # required, with nothing to call
        client.chat.completions.create(model="scripted", messages=QUESTION,
                                       tool_choice="required")
    assert e.value.body["param"] == "tool_choice"
    for shape in ({"type": "function", "function": "calculate"}, [1], 5, True, "always"):
        with pytest.raises(openai.BadRequestError) as e:  # was a 500 AttributeError
            client.chat.completions.create(model="scripted", messages=QUESTION,
                                           tools=tool_schemas(), tool_choice=shape)
        assert e.value.body["param"] == "tool_choice", shape
    with pytest.raises(openai.BadRequestError) as e:  # arguments the template cannot write
        client.chat.completions.create(model="scripted", messages=[*QUESTION, {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": "c1", "type": "function", "function": {"name": "calculate",
                                                             "arguments": "{not json"}}]}])
    assert e.value.body["param"] == "messages" and "not valid JSON" in e.value.body["message"]


def test_the_course_tools_run_on_the_server_only_through_the_safe_executor(server):
    listed = httpx.get(server.url + "/v1/tools", timeout=30).json()["data"]
    assert [t["function"]["name"] for t in listed] == [
        t["function"]["name"] for t in tool_schemas()]

    def run(name, arguments):
        r = httpx.post(server.url + "/v1/tools/run", json={"name": name, "arguments": arguments},
                       timeout=30)
        assert r.status_code == 200, r.text
        return json.loads(r.json()["content"])

    assert run("calculate", {"expression": "256 * 37"}) == {"result": "9472"}
    assert run("calculate", '{"expression": "2 ** 3"}') == {"result": "8"}
    assert "found a call" in run("calculate", {"expression": "__import__('os').system('x')"})[
        "error"]
    assert "exponent" in run("calculate", {"expression": "9**9**9"})["error"]
    assert "unknown tool 'os.system'" in run("os.system", {"command": "ls"})["error"]
    assert "must be a string" in run("weekday", {"date": 20260401})["error"]


def test_the_splitter_holds_back_a_marker_split_across_pieces():
    s = ReplySplitter({"weekday"}, thinking=True)
    text = ('a\nb</think>\n\nIt is\n<tool_call>\n{"name": "weekday", "arguments": '
            '{"date": "2026-04-01"}}\n</tool_call>')
    deltas = [d for i in range(len(text)) for d in s.feed(text[i])] + s.finish()
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "a\nb" == s.reasoning
    assert "".join(d.get("content", "") for d in deltas) == "It is" == s.content
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] \
        == ["weekday"]
    assert s.finish_reason("stop") == "tool_calls" and s.finish_reason("length") == "length"
