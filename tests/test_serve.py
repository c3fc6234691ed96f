"""The server (minimind_lib.inference.serve) against a real uvicorn on a free 127.0.0.1 port: both
endpoints, streaming, bad requests, 64 concurrent requests; plus the text streamer, the chat
session and the CLI (`serve` in a subprocess, `chat` on stdin)."""

import asyncio
import io
import json
import os
import subprocess
import sys

import httpx
import pytest
import torch
from tiny import noisy

from minimind_lib.course.pipeline import find_model_dir
from minimind_lib.inference.chat import ChatSession, SamplingParams, TextStream, chat_loop, complete
from minimind_lib.inference.serve.app import create_app
from minimind_lib.inference.serve.launch import BackgroundServer, launch_server_process
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import save_model
from minimind_lib.tokenizer import encode_chat, train_bpe_fast

CONTEXT = 128
CORPUS = ["hello world, this is a tiny corpus. 你好世界！" * 3,
          "the quick brown fox jumps over the lazy dog"] * 20


@pytest.fixture(scope="module")
def tok():
    # small vocabulary: Chinese characters stay split into byte tokens, so the streamer's
    # incremental UTF-8 decoding is exercised
    return train_bpe_fast(CORPUS, vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    """An untrained model with large untied random weights: its greedy answers differ from
    prompt to prompt (a trained-looking model is not needed to test serving, and a model that
    always says the same thing could not reveal answers mixed up between requests)."""
    config = MiniMindConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=CONTEXT, tie_word_embeddings=False)
    return noisy(MiniMindForCausalLM(config))


@pytest.fixture(scope="module")
def server(model, tok):
    with BackgroundServer(create_app(model, tok, model_name="tiny")) as s:
        yield s


def user(text):
    return [{"role": "user", "content": text}]


def expected(model, tok, text, max_new, **kw):
    """The answer computed directly, without the server."""
    ids = encode_chat(tok, user(text), add_generation_prompt=True)
    return complete(model, tok, ids, SamplingParams(max_new, **kw))


# --------------------------------------------------------------------------- the streamer


class ScriptedModel(torch.nn.Module):
    """Stands in for the model to feed the streamer chosen tokens."""

    def __init__(self, tokens):
        super().__init__()
        self.tokens = tokens
        self.config = MiniMindConfig(vocab_size=512, hidden_size=8, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=64)
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def stream(self, ids, max_new_tokens, *args, **kwargs):
        for t in self.tokens[:max_new_tokens]:
            yield torch.tensor([t])


def test_streamer_never_splits_a_character(tok):
    text = "你好 fox"
    byte_tokens = [tok.vocab[c] for c in _byte_symbols(text)]
    stop = tok.vocab["<|im_end|>"]
    stream = TextStream(ScriptedModel([*byte_tokens, stop, 5]), tok, [3], SamplingParams(50))
    chunks = list(stream)
    assert "".join(chunks) == text == stream.text
    assert all("\ufffd" not in c for c in chunks)
    assert len(chunks) == len(text)  # one chunk per character: 你 and 好 needed 3 tokens each
    assert stream.finish_reason == "stop" and stream.completion_tokens == len(byte_tokens) + 1


def _byte_symbols(text):
    """``text`` as one byte-level symbol per UTF-8 byte (the tokenizer's 256 base tokens)."""
    from minimind_lib.tokenizer.bpe import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in text.encode("utf-8")]


def test_streamer_limits_and_cancel(tok):
    stream = TextStream(ScriptedModel([70] * 10), tok, [3], SamplingParams(4))
    assert len(list(stream)) == 4 and stream.finish_reason == "length"
    seen = []
    stream = TextStream(ScriptedModel([70] * 10), tok, [3], SamplingParams(10),
                        cancelled=lambda: len(seen) >= 2)
    for chunk in stream:
        seen.append(chunk)
    assert len(seen) == 2 and stream.finish_reason == "cancelled"
    with pytest.raises(ValueError, match="exceeds the model's context"):
        TextStream(ScriptedModel([]), tok, [1] * 60, SamplingParams(5))
    with pytest.raises(ValueError, match="empty"):
        TextStream(ScriptedModel([]), tok, [], SamplingParams(1))


def test_chat_session_keeps_history_and_fits_the_context(model, tok):
    chat = ChatSession(model, tok, system="Be brief.", params=SamplingParams(8, temperature=0))
    first = chat.ask("hello")
    assert first == expected_with(model, tok, chat, 0)
    chat.ask("and again")
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user",
                                                  "assistant"]
    for _ in range(5):  # more than fits in 128 positions: old turns are dropped
        chat.ask("the quick brown fox jumps over the lazy dog")
    prompt = encode_chat(tok, chat.messages[:-1], add_generation_prompt=True)
    assert len(prompt) + 8 <= CONTEXT and chat.messages[0]["role"] == "system"
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "Be brief."}]


def expected_with(model, tok, chat, turn):
    msgs = chat.messages[: 2 + 2 * turn]  # system + user of that turn
    ids = encode_chat(tok, msgs, add_generation_prompt=True)
    return complete(model, tok, ids, chat.params).text


def test_chat_loop_on_scripted_input(model, tok):
    lines = iter(["hello", "/reset", "", "hi", "/exit"])
    out = io.StringIO()
    chat = ChatSession(model, tok, params=SamplingParams(4, temperature=0))
    chat_loop(chat, read=lambda _: next(lines), out=out)
    assert out.getvalue().count("minimind> ") == 2 and "(conversation cleared)" in out.getvalue()
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["hi"]


# --------------------------------------------------------------------------- the HTTP API


def test_models_endpoint(server):
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["data"][0]["id"] == "tiny"
    assert body["data"][0]["context_length"] == CONTEXT


def test_chat_completion_matches_direct_generation(server, model, tok):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": user("question 3: fox?"), "max_tokens": 12,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    want = expected(model, tok, "question 3: fox?", 12, temperature=0)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": want.text}
    assert choice["finish_reason"] == want.finish_reason
    n_prompt = len(encode_chat(tok, user("question 3: fox?"), add_generation_prompt=True))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": want.completion_tokens,
                             "total_tokens": n_prompt + want.completion_tokens}


def test_content_parts_and_seeded_sampling(server, model, tok):
    parts = {"role": "user", "content": [{"type": "text", "text": "question "},
                                         {"type": "text", "text": "5"}]}
    req = {"messages": [parts], "max_tokens": 10, "temperature": 1.0, "top_k": 50, "seed": 7}
    a = httpx.post(server.url + "/v1/chat/completions", json=req, timeout=60).json()
    b = httpx.post(server.url + "/v1/chat/completions", json=req, timeout=60).json()
    want = expected(model, tok, "question 5", 10, temperature=1.0, top_k=50, seed=7)
    assert (a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
            == want.text)


def read_sse(response):
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", line  # nothing but data lines and blank separators
    return events


def test_streaming_chat_completion(server, model, tok):
    req = {"messages": user("question 7: fox?"), "max_tokens": 12, "temperature": 0,
           "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=req, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks + [usage]}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    want = expected(model, tok, "question 7: fox?", 12, temperature=0)
    assert text == want.text
    assert chunks[-1]["choices"][0]["finish_reason"] == want.finish_reason
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == want.completion_tokens


def test_generate_endpoint(server, model, tok):
    r = httpx.post(server.url + "/generate", timeout=60,
                   json={"prompt": "question 9: fox?", "max_new_tokens": 10, "temperature": 0})
    assert r.status_code == 200
    want = expected(model, tok, "question 9: fox?", 10, temperature=0)
    assert r.json()["text"] == want.text and r.json()["finish_reason"] == want.finish_reason
    raw = httpx.post(server.url + "/generate", timeout=60, json={
        "prompt": "the quick brown", "chat": False, "max_new_tokens": 6, "temperature": 0}).json()
    ids = tok.encode("the quick brown", allowed_special=set())
    direct = complete(model, tok, ids, SamplingParams(6, temperature=0),
                      stop={tok.vocab["<|endoftext|>"]})
    assert raw["text"] == direct.text and raw["prompt_tokens"] == len(ids)


FN = {"type": "function", "function": {"name": "f", "parameters": {}}}


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "hi"}]},
     "messages.0.role", "'system', 'developer', 'user', 'assistant' or 'tool'"),
    ("/v1/chat/completions", {"messages": user("hi"), "temperature": -0.5},
     "temperature", "temperature must be a finite number >= 0, got -0.5"),
    ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": CONTEXT},
     "max_tokens", "exceeds the model's context of 128 tokens"),
    ("/v1/chat/completions", {"messages": user("hi"), "max_tokens": 0}, "max_tokens",
     "max_tokens must be an integer >= 1, got 0"),
    ("/v1/chat/completions", {"messages": user("fox " * 200)}, "messages", "no room"),
    ("/v1/chat/completions", {"messages": []}, "messages", "at least 1"),
    ("/v1/chat/completions", {"messages": user("hi"), "top_p": 1.5}, "top_p", "in (0, 1]"),
    ("/v1/chat/completions", {"messages": user("hi"), "n": 2}, "n", "less than or equal to 1"),
    ("/v1/chat/completions", {"messages": user("hi"), "stop": ["\n"]}, "stop", "not supported"),
    ("/v1/chat/completions", {"messages": user("hi"), "functions": [{"name": "f"}]},
     "functions", "deprecated function calling: send tools"),
    ("/v1/chat/completions", {"messages": user("hi"), "logprobs": True}, "logprobs",
     "does not support it"),
    ("/v1/chat/completions", {"messages": user("hi"), "tool_choice": "required"},
     "tool_choice", "needs tools"),
    ("/v1/chat/completions", {"messages": user("hi"), "tools": [FN], "tool_choice": {
        "type": "function", "function": "f"}}, "tool_choice", "must be"),
    ("/v1/chat/completions", {"messages": user("hi"), "tools": [FN], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, "tool_choice", "not among the tools"),
    ("/v1/chat/completions", {"messages": user("hi"), "tools": [{"type": "retrieval"}]},
     "tools.0.type", "'function'"),
    ("/v1/chat/completions", {"messages": user("hi"), "tools": [{"type": "function", "function": {
        "name": "rm -rf"}}]}, "tools.0.function.name", "pattern"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None}]},
     "messages.0", "content is required"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]}, "messages.0", "only an assistant"),
    ("/v1/chat/completions", {"messages": user("hi"), "chat_template_kwargs": {
        "enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking", "boolean"),
    ("/v1/tools/run", {"name": "calculate", "arguments": 5}, "arguments.str", "string"),
    ("/v1/chat/completions", {"prompt": "hi"}, "messages", "Field required"),
    ("/generate", {"prompt": "hi", "max_new_tokens": 500}, "max_new_tokens", "context"),
    ("/generate", {"prompt": "hi", "temprature": 0.5}, "temprature", "Extra inputs"),
    ("/generate", {"prompt": ""}, "prompt", "at least 1 character"),
])
def test_bad_requests_get_400_with_a_message(server, path, body, param, words):
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"], error["message"]


def test_malformed_json(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_sixty_four_concurrent_requests(server, model, tok):
    """64 requests at once (greedy and seeded-sampled, plain and streaming): every answer is
    the one the request gets alone."""
    prompts = [f"question {i}: fox?" for i in range(64)]
    sampled = {i: {"temperature": 0.9, "top_p": 0.9, "seed": 100 + i} for i in range(0, 64, 4)}
    want = {i: expected(model, tok, p, 12, **sampled.get(i, {"temperature": 0})).text
            for i, p in enumerate(prompts)}
    assert len(set(want.values())) >= 48  # answers differ, so a mix-up would show

    async def one(client, i):
        req = {"messages": user(prompts[i]), "max_tokens": 12,
               **sampled.get(i, {"temperature": 0})}
        if i % 2:  # half of them stream
            async with client.stream("POST", "/v1/chat/completions",
                                     json={**req, "stream": True}) as r:
                assert r.status_code == 200
                text = ""
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                return text
        r = await client.post("/v1/chat/completions", json=req)
        assert r.status_code == 200
        return r.json()["choices"][0]["message"]["content"]

    async def all_at_once():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    got = asyncio.run(all_at_once())
    assert {i: t for i, t in enumerate(got)} == want


def test_disconnected_stream_frees_the_worker(server, model, tok):
    """A client that leaves mid-stream cancels its job; the next request is served."""
    req = {"messages": user("question 1: fox?"), "max_tokens": CONTEXT - 60, "temperature": 0.5,
           "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=req, timeout=60) as r:
        next(r.iter_lines())  # the first event, then hang up
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": user("question 2: fox?"), "max_tokens": 5, "temperature": 0})
    assert r.json()["choices"][0]["message"]["content"] == \
        expected(model, tok, "question 2: fox?", 5, temperature=0).text


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, model, tok):
    """A runs/<profile> tree with a finished sft stage and the tokenizer stage."""
    root = tmp_path_factory.mktemp("runs")
    save_model(model, root / "sft")
    (root / "sft" / "stage.json").write_text(json.dumps({"stage": "sft"}))
    (root / "tokenizer").mkdir()
    tok.save(root / "tokenizer" / "tokenizer.json")
    return root


def test_find_model_dir(run_dir, tmp_path):
    assert find_model_dir(run_dir) == run_dir / "sft"
    (run_dir / "pretrain").mkdir(exist_ok=True)  # no stage.json: not finished, not chosen
    assert find_model_dir(run_dir) == run_dir / "sft"
    with pytest.raises(FileNotFoundError, match="no finished stage"):
        find_model_dir(tmp_path)


def test_serve_command_in_a_subprocess(run_dir, model, tok):
    proc, url = launch_server_process(run_dir / "sft")
    try:
        assert url.startswith("http://127.0.0.1:")
        r = httpx.post(url + "/generate", timeout=60,
                       json={"prompt": "question 4: fox?", "max_new_tokens": 8, "temperature": 0})
        assert r.json()["text"] == expected(model, tok, "question 4: fox?", 8, temperature=0).text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_chat_command_on_stdin(run_dir, model, tok):
    out = subprocess.run(
        [sys.executable, "-m", "minimind_lib", "chat", "--out", str(run_dir), "--temperature", "0",
         "--max-new-tokens", "6"], input=b"question 6: fox?\n/exit\n", capture_output=True,
        timeout=120, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert out.returncode == 0, out.stderr.decode()
    answer = expected(model, tok, "question 6: fox?", 6, temperature=0).text
    # bytes, not text mode: the random model's answer may hold a "\r" that text mode would turn
    # into "\n"
    assert f"minimind> {answer}\n".encode() in out.stdout
