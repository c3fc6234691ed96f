"""Issue #15: the server, the files and the CLI under bad input and abandoned clients.

One section per failure the reliability probe found (numbered as in the issue); each test
failed on the code before the fix. Only names that existed before are imported at the top,
so against the old code each test fails on its own assertion, not on an import.
"""

import asyncio
import io
import json
import math
import socket
import subprocess
import sys
import threading
import time
import warnings

import httpx
import pytest
import torch
from tiny import noisy
from torch.utils.data import Dataset

from minimind_lib.__main__ import main
from minimind_lib.course.plotting import read_metrics
from minimind_lib.data import DataFormatError, read_jsonl
from minimind_lib.inference.chat import ChatSession, SamplingParams, chat_loop, complete
from minimind_lib.inference.serve import app as serve_app
from minimind_lib.inference.serve.app import create_app
from minimind_lib.inference.serve.errors import RETRY_AFTER_SECONDS
from minimind_lib.inference.serve.launch import BackgroundServer, launch_server_process
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_checkpoint, load_model, save_checkpoint, save_model
from minimind_lib.model.sampling import sample_next_token
from minimind_lib.tokenizer import encode_chat, train_bpe_fast
from minimind_lib.training import TrainConfig, train

CONTEXT = 128
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tok():
    return train_bpe_fast(["hello world, the quick brown fox jumps over the lazy dog"] * 20,
                          vocab_size=300)


@pytest.fixture(scope="module")
def model(tok):
    """Untrained, with large random weights: greedy answers differ from prompt to prompt."""
    config = MiniMindConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1,
                            max_position_embeddings=CONTEXT, tie_word_embeddings=False)
    return noisy(MiniMindForCausalLM(config))


@pytest.fixture(scope="module")
def server(model, tok):
    with BackgroundServer(create_app(model, tok)) as s:
        yield s


def user(text):
    return [{"role": "user", "content": text}]


def greedy(model, tok, messages, max_new):
    ids = encode_chat(tok, messages, add_generation_prompt=True)
    return complete(model, tok, ids, SamplingParams(max_new, temperature=0)).text


def answer(response):
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def openai_error(response, status):
    """The error object of ``response``, checking the status and OpenAI's error shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


class SlowModel(torch.nn.Module):
    """Stands in for the model: one token every 5 ms, counting the tokens it generated."""

    def __init__(self, context=4096):
        super().__init__()
        self.config = MiniMindConfig(vocab_size=512, hidden_size=8, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=context)
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.generated = 0

    def stream(self, ids, max_new_tokens, *args, **kwargs):
        for _ in range(max_new_tokens):
            time.sleep(0.005)
            self.generated += 1
            yield torch.tensor([70])  # a byte token: plain text, never a stop token


class BrokenModel(SlowModel):
    """Fails inside generation, whatever the request: a bug, not bad input."""

    def stream(self, ids, max_new_tokens, *args, **kwargs):
        raise RuntimeError("the model broke")
        yield


# --- 1. abandoned requests and an unbounded queue -----------------------------------------


def test_abandoned_non_streaming_requests_are_cancelled(tok):
    """Three clients give up after 0.3 s on 1,000-token answers: the running job stops and the
    waiting ones never start, so the next request does not wait behind 3,000 tokens."""
    model = SlowModel()
    with BackgroundServer(create_app(model, tok)) as server:
        async def abandon():
            async with httpx.AsyncClient(base_url=server.url, timeout=0.3) as client:
                with pytest.raises(httpx.TimeoutException):
                    await client.post(CHAT, json={"messages": user("hi"), "max_tokens": 1000})

        async def three():
            await asyncio.gather(*(abandon() for _ in range(3)))

        asyncio.run(three())
        r = httpx.post(server.url + CHAT, timeout=120,
                       json={"messages": user("hi"), "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    # each abandoned job would have generated 1,000 tokens; the 3 together made under 1,000
    assert model.generated - 4 < 1000


def test_a_full_queue_answers_503_with_retry_after(tok):
    model = SlowModel()
    app = create_app(model, tok, max_waiting=2)
    small = {"messages": user("hi"), "max_tokens": 3}

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            long = {"messages": user("hi"), "max_tokens": 3000, "stream": True}
            async with client.stream("POST", CHAT, json=long) as running:
                lines = running.aiter_lines()  # kept: a dropped iterator would hang up
                await anext(lines)  # the job holds the worker
                waiting = [asyncio.create_task(client.post(CHAT, json=small)) for _ in range(2)]
                for _ in range(6000):  # until both wait (each poll yields to the requests)
                    if app.state.engine.waiting == 2:
                        break
                    await asyncio.sleep(0.01)
                refused = await client.post(CHAT, json=small)
            # leaving the stream hangs up: its job is cancelled, the two waiting ones run
            return refused, await asyncio.gather(*waiting)

    with BackgroundServer(app) as server:
        refused, served = asyncio.run(scenario())
    error = openai_error(refused, 503)
    assert refused.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    assert error["code"] == "server_busy" and "2 requests are waiting" in error["message"]
    assert [answer(r) for r in served] == [answer(r) for r in served[:1]] * 2
    assert model.generated < 3000


# --- 2. values that passed validation crashed generation ----------------------------------


@pytest.mark.parametrize("extreme", [{"temperature": 1e-40}, {"temperature": 1e-300},
                                     {"temperature": 1.0, "top_p": 1e-46}])
def test_extreme_but_valid_sampling_is_greedy(server, model, tok, extreme):
    """A temperature that underflows float32 (below model.MIN_TEMPERATURE) and a top_p below
    float32's resolution both leave only the best token: the greedy answer, not a 500."""
    r = httpx.post(server.url + CHAT, timeout=60,
                   json={"messages": user("question 1"), "max_tokens": 8, **extreme})
    assert answer(r) == greedy(model, tok, user("question 1"), 8)


@pytest.mark.parametrize("field,value,words", [
    ("seed", str(2**64), "seed must be an integer in [0, 4294967295]"),
    ("seed", str(-2**70), "seed must be an integer in [0, 4294967295]"),
    ("seed", str(2**32 + 5), "seed must be an integer"),  # the CPU generator would read 5
    ("temperature", "NaN", "temperature must be a finite number >= 0, got nan"),
    ("temperature", "1e400", "temperature must be a finite number >= 0, got inf"),
    ("top_p", "Infinity", "top_p must be a number in (0, 1], got inf"),
    ("top_k", "0", "top_k must be an integer >= 1, got 0"),
])
def test_out_of_range_sampling_is_a_400_and_the_connection_lives_on(server, field, value, words):
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "%s": %s}'
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post(CHAT, content=body % (field, value),
                        headers={"content-type": "application/json"})
        error = openai_error(r, 400)
        assert error["param"] == field and words in error["message"], error
        # the same keep-alive connection serves the next request
        assert client.get("/v1/models").status_code == 200


def test_one_sampling_validator_for_library_and_cli(tmp_path, capsys):
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        SamplingParams(temperature=float("nan"))
    with pytest.raises(ValueError, match="seed must be an integer in"):
        SamplingParams(seed=2**32)
    assert SamplingParams(seed=2**32 - 1).seed == 2**32 - 1
    logits = torch.tensor([[0.5, 3.0, 1.0]])
    assert sample_next_token(logits, temperature=1e-40).tolist() == [1]
    assert sample_next_token(logits, temperature=1.0, top_p=1e-46).tolist() == [1]
    with pytest.raises(ValueError, match="finite"):
        sample_next_token(logits, temperature=math.inf)
    # the CLI checks sampling settings before it looks for a model
    assert main(["chat", "--temperature", "nan", "--model", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err == "error: --temperature: temperature must be a finite number >= 0, got nan\n"


# --- 3. a lone surrogate -------------------------------------------------------------------


def test_a_lone_surrogate_is_a_400_and_a_data_error(server, model, tok, tmp_path):
    for content in ('"a\\ud800b"', '[{"type": "text", "text": "\\udfff"}]'):
        body = '{"messages": [{"role": "user", "content": ' + content + '}], "max_tokens": 3}'
        r = httpx.post(server.url + CHAT, content=body,
                       headers={"content-type": "application/json"})
        error = openai_error(r, 400)
        assert error["param"] == "messages.0.content" and "lone surrogate" in error["message"]
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "bad \\ud800"}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"x\.jsonl:2: field 'text' holds a lone surrogate"):
        list(read_jsonl(path, "pretrain"))
    path.write_text('{"conversations": [{"role": "user", "content": "\\udc80"}, '
                    '{"role": "assistant", "content": "ok"}]}\n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"x\.jsonl:1: conversations\[0\]\.content holds"):
        list(read_jsonl(path, "sft"))
    chat = ChatSession(model, tok, params=SamplingParams(4, temperature=0))
    with pytest.raises(ValueError, match="lone surrogate"):
        chat.send("\ud800")
    assert chat.messages == []


# --- 4. request size; tokenising off the event loop ----------------------------------------


def test_bodies_and_prompts_over_the_limits_get_413(model, tok):
    with BackgroundServer(create_app(model, tok, max_body_bytes=10_000)) as s:
        big = json.dumps({"messages": user("x" * 20_000)})
        error = openai_error(httpx.post(s.url + CHAT, content=big, timeout=30), 413)
        assert "10,000 bytes" in error["message"]

        def chunks():  # no Content-Length: the limit applies as the bytes arrive
            for i in range(0, len(big), 1000):
                yield big[i:i + 1000].encode()

        error = openai_error(httpx.post(s.url + CHAT, content=chunks(), timeout=30), 413)
        assert "10,000 bytes" in error["message"]
        limit = s.server.config.app.state.server.max_prompt_chars
        error = openai_error(httpx.post(s.url + CHAT, timeout=30,
                                        json={"messages": user("x" * (limit + 1))}), 413)
        assert error["param"] == "messages" and f"at most {limit:,}" in error["message"]
        assert limit < 20_000  # 128 positions x the longest token's bytes


def test_tokenising_runs_off_the_event_loop(server, monkeypatch):
    threads = []

    def recording_encode_chat(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return encode_chat(*args, **kwargs)

    monkeypatch.setattr(serve_app, "encode_chat", recording_encode_chat)
    r = httpx.post(server.url + CHAT, json={"messages": user("hi"), "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and len(threads) == 1
    assert threads[0] != "uvicorn"  # BackgroundServer's event loop runs on that thread


# --- 5. data files -------------------------------------------------------------------------


def test_data_file_errors_name_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"text": "one"}\n{"text": "two"}\n{"text": "caf\xe9"}\n')
    records = read_jsonl(path, "pretrain")
    assert [next(records), next(records)] == [{"text": "one"}, {"text": "two"}]
    with pytest.raises(DataFormatError, match=r"x\.jsonl:3: not valid UTF-8 \(byte 0xe9"):
        next(records)
    path.write_text('{"text": "ok"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataFormatError, match=r"x\.jsonl:2: JSON nested too deeply"):
        list(read_jsonl(path, "pretrain"))
    path.write_bytes(b'\xef\xbb\xbf{"text": "an editor wrote a byte-order mark"}\n')
    assert len(list(read_jsonl(path, "pretrain"))) == 1


# --- 6. checkpoints ------------------------------------------------------------------------

SMALL = MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64)


def saved(tmp_path, config=SMALL):
    torch.manual_seed(0)
    return save_model(MiniMindForCausalLM(config), tmp_path / "m")


def edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_damaged_weights_file_is_named(tmp_path):
    folder = saved(tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    for damaged in (data[: len(data) // 2], data[:5], b"", b"\0" * 8 + data[8:]):
        weights.write_bytes(damaged)
        with pytest.raises(ValueError, match=rf"{weights}: not a readable safetensors file"):
            load_model(folder)


@pytest.mark.parametrize("changes,words", [
    ({"hidden_size": 32.0}, "hidden_size must be an integer, got 32.0"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be > 0, got -1"),
    ({"rope_theta": "1e6"}, "rope_theta must be a number"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"num_hidden_layers": None}, "num_hidden_layers must not be null"),
])
def test_config_types_and_ranges_name_the_file_and_field(tmp_path, changes, words):
    folder = saved(tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=rf"config\.json: {words}"):
        load_model(folder)


@pytest.mark.parametrize("changes", [{"rope_theta": 10000.0}, {"max_position_embeddings": 128}])
def test_a_config_edited_after_saving_is_refused(tmp_path, changes):
    """RoPE tables are not saved, so a changed rope_theta or context would load silently and
    answer wrongly; the config recorded in the weights file catches it."""
    folder = saved(tmp_path)
    edit_config(folder, **changes)
    (field, value), = changes.items()
    with pytest.raises(ValueError, match=rf"config\.json does not match .*{field} is {value}"):
        load_model(folder)


def test_nan_weights_are_refused(tmp_path):
    torch.manual_seed(0)
    broken = MiniMindForCausalLM(SMALL)
    with torch.no_grad():
        broken.model.layers[1].mlp.up_proj.weight[0, :3] = float("nan")
    save_model(broken, tmp_path / "m")
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' holds 3 NaN"):
        load_model(tmp_path / "m")
    ckpt = save_checkpoint(tmp_path / "run", 1, broken, {"step": 1})
    with pytest.raises(ValueError, match="NaN or infinite"):
        load_checkpoint(ckpt, MiniMindForCausalLM(SMALL))


# --- 7. resuming after a torn last line of metrics.jsonl -----------------------------------


class RandomTokens(Dataset):
    def __init__(self):
        self.data = torch.randint(0, 64, (32, 17), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def test_resume_after_a_torn_metrics_line(tmp_path):
    def run(max_steps, resume):
        torch.manual_seed(0)
        cfg = TrainConfig(batch_size=4, max_steps=max_steps, warmup_steps=1, save_every=2,
                          precision="fp32", progress=False, seed=0, device="cpu", out_dir=tmp_path)
        return train(MiniMindForCausalLM(SMALL), RandomTokens(), cfg, resume=resume)

    run(4, resume=False)
    metrics = tmp_path / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 5, "loss": 4.1')  # kill -9 in the middle of step 5's row
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:5: dropped a torn last line"):
        assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3, 4]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(6, resume=True)
    assert any("torn last line" in str(w.message) for w in caught)
    assert [r["step"] for r in resumed] == [5, 6]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(
        range(1, 7))


# --- 8. chat survives a message it cannot send ---------------------------------------------


def test_chat_survives_an_over_long_message(model, tok):
    lines = iter(["hello", "fox " * 500, "again", "/exit"])
    out = io.StringIO()
    chat = ChatSession(model, tok, params=SamplingParams(4, temperature=0))
    chat_loop(chat, read=lambda _: next(lines), out=out)
    text = out.getvalue()
    assert "(not sent: the message is too long" in text and f"context is {CONTEXT}" in text
    assert text.count("minimind> ") == 2
    assert [m["content"] for m in chat.messages if m["role"] == "user"] == ["hello", "again"]


# --- 9. CLI runtime errors -----------------------------------------------------------------


def test_cli_errors_are_one_line_without_a_traceback(tmp_path, capsys, monkeypatch):
    def error_of(argv, code=1):
        assert main(argv) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
        return err

    monkeypatch.setenv("MINIMIND_PROFILE", "bogus")
    assert "unknown profile 'bogus'" in error_of(["pretrain"])
    monkeypatch.setenv("MINIMIND_PROFILE", "smoke")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert "is a file, not a folder" in error_of(["pretrain", "--out", str(a_file / "runs")])
    assert "none/config.json: no such file" in error_of(["chat", "--model", str(tmp_path / "none")])
    with socket.socket() as taken:  # the port is checked before the model is looked for
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = error_of(["serve", "--port", str(port), "--model", str(tmp_path / "none")])
        assert f"cannot listen on 127.0.0.1:{port}" in err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--port", "99999"])
    assert exit_.value.code == 2 and "'99999' is not a TCP port" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):  # --debug: the traceback, as before
        main(["--debug", "chat", "--model", str(tmp_path / "none")])
    monkeypatch.setenv("MINIMIND_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["chat", "--model", str(tmp_path / "none")])


def test_cli_error_in_a_subprocess(tmp_path):
    out = subprocess.run([sys.executable, "-m", "minimind_lib", "chat", "--model",
                          str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [f"error: {tmp_path / 'none' / 'config.json'}: no such "
                                       f"file (is {tmp_path / 'none'} a model folder?)"]


# --- 10. error bodies ----------------------------------------------------------------------


@pytest.mark.parametrize("body,words", [
    (b'{"messages": [{"role": "user", "content": "\xff"}]}', "not valid UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_unreadable_bodies_get_openai_errors(server, body, words):
    r = httpx.post(server.url + CHAT, content=body, headers={"content-type": "application/json"})
    assert words in openai_error(r, 400)["message"]


def test_404_405_and_500_have_openai_errors_and_keep_the_connection(server, tok):
    assert openai_error(httpx.get(server.url + "/v2/nothing"), 404)["message"] == "Not Found"
    openai_error(httpx.get(server.url + "/generate"), 405)
    with BackgroundServer(create_app(BrokenModel(), tok)) as s, \
            httpx.Client(base_url=s.url, timeout=30) as client:
        error = openai_error(client.post(CHAT, json={"messages": user("hi"), "max_tokens": 2}),
                             500)
        assert error["type"] == "server_error" and "the model broke" in error["message"]
        assert client.get("/v1/models").status_code == 200  # the same connection still works


# --- 11. the developer role, an API key ----------------------------------------------------


def test_developer_role_is_the_system_role(server, model, tok):
    def ask(role):
        return answer(httpx.post(server.url + CHAT, timeout=60, json={
            "messages": [{"role": role, "content": "Be brief."}, *user("fox?")],
            "max_tokens": 8, "temperature": 0}))

    assert ask("developer") == ask("system") == greedy(
        model, tok, [{"role": "system", "content": "Be brief."}, *user("fox?")], 8)


def test_api_key(model, tok):
    with BackgroundServer(create_app(model, tok, api_key="sesame")) as s:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            r = httpx.get(s.url + "/v1/models", headers=headers)
            assert openai_error(r, 401)["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(s.url + CHAT, json={"messages": user("hi"), "max_tokens": 2})
        openai_error(r, 401)
        good = {"Authorization": "Bearer sesame"}
        assert httpx.get(s.url + "/v1/models", headers=good).status_code == 200
        r = httpx.post(s.url + CHAT, headers=good, timeout=60,
                       json={"messages": user("hi"), "max_tokens": 2})
        assert r.status_code == 200


def test_serve_command_with_an_api_key(tmp_path, model, tok):
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m" / "tokenizer.json")
    proc, url = launch_server_process(tmp_path / "m", api_key="sesame")  # via MINIMIND_API_KEY
    try:
        assert httpx.get(url + "/v1/models").status_code == 401
        r = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sesame"})
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
