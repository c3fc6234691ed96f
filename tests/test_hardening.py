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


class SlowMiniMind(MiniMindForCausalLM):
    """The batched engine's stand-in: a real ``MiniMindForCausalLM`` whose every forward step
    sleeps 5 ms and whose head always prefers token 70 (plain text, never a stop token);
    ``generated`` counts the tokens it computed, row by row."""

    def __init__(self, vocab_size, context=4096, broken=False):
        super().__init__(MiniMindConfig(vocab_size=vocab_size, hidden_size=8, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=context))
        self.generated, self.broken = 0, broken
        self.model.register_forward_pre_hook(self._step)
        self.lm_head.register_forward_hook(lambda _, __, logits: torch.nn.functional.one_hot(
            torch.full(logits.shape[:-1], 70), logits.shape[-1]).float() * 1e4)

    def _step(self, _, args):
        if self.broken:
            raise RuntimeError("the model broke")
        time.sleep(0.005)
        self.generated += args[0].shape[0]


def slow_model(kind, tok):
    """A one-job-at-a-time stand-in, or a batched one (``create_app`` batches a MiniMind)."""
    return SlowModel() if kind == "serial" else SlowMiniMind(len(tok))


# --- 1. abandoned requests and an unbounded queue -----------------------------------------


@pytest.mark.parametrize("kind", ["serial", "batched"])
def test_abandoned_non_streaming_requests_are_cancelled(tok, kind):
    """Three clients give up after 0.3 s on 1,000-token answers: the running job stops and the
    waiting ones never start, so the next request does not wait behind 3,000 tokens."""
    model = slow_model(kind, tok)
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


@pytest.mark.parametrize("kind", ["serial", "batched"])
def test_a_full_queue_answers_503_with_retry_after(tok, kind):
    model = slow_model(kind, tok)
    app = create_app(model, tok, max_waiting=2, max_batch=1)
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


def test_requests_wait_only_for_a_place_in_the_batch(tok):
    """Two long answers fill a batch of two; a third request waits (a fourth is refused) until
    one of them hangs up, then joins the running batch."""
    model = SlowMiniMind(len(tok))
    app = create_app(model, tok, max_waiting=1, max_batch=2)
    long = {"messages": user("hi"), "max_tokens": 3000, "stream": True}
    small = {"messages": user("hi"), "max_tokens": 3}

    async def some_text(lines):  # the first chunk is sent before decoding: wait for text
        async for line in lines:
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get(
                    "content"):
                return

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            async with client.stream("POST", CHAT, json=long) as first:
                first_lines = first.aiter_lines()
                await some_text(first_lines)
                async with client.stream("POST", CHAT, json=long) as second:
                    second_lines = second.aiter_lines()
                    await some_text(second_lines)  # both decode together
                    waiting = asyncio.create_task(client.post(CHAT, json=small))
                    for _ in range(6000):
                        if app.state.engine.waiting == 1:
                            break
                        await asyncio.sleep(0.01)
                    refused = await client.post(CHAT, json=small)
                    assert not waiting.done()  # no place yet
                # the second hangs up: the waiting request takes its place beside the first
                served = await waiting
                await some_text(first_lines)  # the first still streams
            return refused, served

    with BackgroundServer(app) as server:
        refused, served = asyncio.run(scenario())
    assert openai_error(refused, 503)["code"] == "server_busy"
    assert answer(served) == "".join(tok.decode([70]) for _ in range(3))
    assert model.generated < 2 * 3000


def test_concurrent_greedy_requests_answer_as_alone(model, tok, server):
    """Requests of different lengths decode in one batch, with their own settings: each greedy
    answer equals the lone one, a seeded sampled answer its lone twin."""
    prompts = [user("hello " * n + "world") for n in range(1, 13)]
    sampled = {"temperature": 1.0, "top_k": 20, "seed": 7}

    async def together():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            bodies = [{"messages": m, "max_tokens": 5 + i, "temperature": 0}
                      for i, m in enumerate(prompts)]
            bodies += [{"messages": prompts[0], "max_tokens": 12, **sampled}] * 2
            return await asyncio.gather(*(client.post(CHAT, json=b) for b in bodies))

    replies = [answer(r) for r in asyncio.run(together())]
    assert replies[:12] == [greedy(model, tok, m, 5 + i) for i, m in enumerate(prompts)]
    lone = answer(httpx.post(server.url + CHAT, timeout=60,
                             json={"messages": prompts[0], "max_tokens": 12, **sampled}))
    assert replies[12] == replies[13] == lone


@pytest.mark.parametrize("max_batch", ["0", "2000", "x"])
def test_an_absurd_max_batch_is_refused_by_the_cli(max_batch, capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--max-batch", max_batch])
    assert "not a batch size" in capsys.readouterr().err


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


def record_threads(monkeypatch, module, name):
    """Replace ``module.name`` by a wrapper noting the thread of every call; the list of names."""
    threads, real = [], getattr(module, name)

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return threads


def test_tokenising_runs_off_the_event_loop(server, monkeypatch):
    threads = record_threads(monkeypatch, serve_app, "encode_chat")
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
    for broken in (BrokenModel(), SlowMiniMind(len(tok), broken=True)):  # serial, batched
        with BackgroundServer(create_app(broken, tok)) as s, \
                httpx.Client(base_url=s.url, timeout=30) as client:
            error = openai_error(client.post(CHAT, json={"messages": user("hi"),
                                                         "max_tokens": 2}), 500)
            assert error["type"] == "server_error" and "the model broke" in error["message"]
            assert client.get("/v1/models").status_code == 200  # the connection still works


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


# ===========================================================================================
# Issue #27: nothing lost, nothing crashes. One case per failure class of the second probe
# (numbered as in the issue); each failed on the code before the fix. Names that are new with
# the fix are imported inside the tests, so against the old code each fails on its own.
# ===========================================================================================

def _model_folder(path, **config):
    """A saved tiny model (fp32) with the course tokenizer beside it, plus a user's files."""
    from minimind_lib.tokenizer import load_tokenizer

    torch.manual_seed(0)
    save_model(MiniMindForCausalLM(MiniMindConfig(**{
        "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 64, **config})), path)
    load_tokenizer().save_pretrained(path)
    (path / "README.md").write_text("my notes on this run\n")
    (path / "eval.json").write_text('{"per_task": 1, "models": {}}\n')
    return path


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- 27.1 export never deletes ----------------------------------------------------------


def test_export_refuses_a_folder_of_other_files(tmp_path, capsys):
    model_dir = _model_folder(tmp_path / "sft")
    out = tmp_path / "mine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("keep me")
    (out / "sub" / "data.csv").write_text("a,b\n1,2\n")
    before = _snapshot(out)
    assert main(["export", "--format", "hf", "--model", str(model_dir), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "holds other files (notes.txt, sub/)" in err and err.count("\n") == 1
    assert _snapshot(out) == before


def test_export_over_an_earlier_export_replaces_it(tmp_path):
    model_dir = _model_folder(tmp_path / "sft")
    out = tmp_path / "hf"
    for _ in range(2):  # the second writes over the first export: allowed
        assert main(["export", "--format", "hf", "--model", str(model_dir), "--out",
                     str(out)]) == 0
    assert (out / "model.safetensors").is_file() and not list(tmp_path.glob(".hf.*"))


@pytest.mark.parametrize("where", ["same", "inside_hf", "inside_gguf", "parent"])
def test_export_never_writes_over_the_model_folder(tmp_path, capsys, where):
    model_dir = _model_folder(tmp_path / "sft")
    before = _snapshot(model_dir)
    fmt, out = {"same": ("hf", model_dir), "inside_hf": ("hf", model_dir / "hf"),
                "inside_gguf": ("gguf", model_dir / "model.safetensors"),
                "parent": ("hf", tmp_path)}[where]
    assert main(["export", "--format", fmt, "--model", str(model_dir), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "model folder" in err and err.count("\n") == 1
    assert _snapshot(model_dir) == before


def test_export_to_the_current_folder_is_refused_and_leaves_nothing(tmp_path, capsys,
                                                                    monkeypatch):
    model_dir = _model_folder(tmp_path / "sft")
    work = tmp_path / "work"
    work.mkdir()
    (work / "script.py").write_text("print('mine')\n")
    monkeypatch.chdir(work)
    assert main(["export", "--format", "hf", "--model", str(model_dir), "--out", "."]) == 1
    assert "holds other files (script.py)" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["script.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft", "work"]  # no ..old.* folder


def test_export_refuses_a_file_that_is_not_gguf_and_a_vlm_folder(tmp_path, capsys):
    model_dir = _model_folder(tmp_path / "sft")
    precious = tmp_path / "thesis.pdf"
    precious.write_bytes(b"%PDF-1.7 my thesis")
    assert main(["export", "--format", "gguf", "--model", str(model_dir), "--out",
                 str(precious)]) == 1
    assert "is not a GGUF file" in capsys.readouterr().err
    assert precious.read_bytes() == b"%PDF-1.7 my thesis"
    (model_dir / "vision.safetensors").write_bytes(b"")  # a VLM folder's image side
    assert main(["export", "--format", "hf", "--model", str(model_dir), "--out",
                 str(tmp_path / "hf")]) == 1
    assert "vision-language model folder" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_exports_and_model_folders_keep_the_umask_permissions(tmp_path):
    from minimind_lib.core.atomic import DIR_MODE, FILE_MODE

    model_dir = _model_folder(tmp_path / "sft")
    assert (model_dir / "model.safetensors").stat().st_mode & 0o777 == FILE_MODE  # not 0600
    assert main(["export", "--format", "hf", "--model", str(model_dir), "--out",
                 str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf").stat().st_mode & 0o777 == DIR_MODE  # not 0700
    assert all(p.stat().st_mode & 0o777 == FILE_MODE for p in (tmp_path / "hf").iterdir())


# --- 27.2 concurrent runs never overwrite ------------------------------------------------


def test_a_forced_run_that_waited_keeps_the_finished_run(tmp_path, monkeypatch):
    """Two ``pretrain --out SAME``: the second waits for the lock, then rebuilds; the first
    one's finished run must survive in previous/, not be rebuilt over in place."""
    from minimind_lib.course import pipeline, stages
    from minimind_lib.course.pipeline import PREVIOUS_DIR

    started, release = threading.Event(), threading.Event()

    def slow_stage(ctx):
        (ctx.out_dir / "weights.bin").write_text(threading.current_thread().name)
        started.set()
        release.wait(timeout=30)
        return {}

    monkeypatch.setitem(stages.STAGES, "slow", stages.Stage("slow", slow_stage))
    first = threading.Thread(target=pipeline.ensure, name="first", args=("slow", "smoke"),
                             kwargs={"root": tmp_path, "force": True})
    first.start()
    assert started.wait(timeout=30)
    second = threading.Thread(target=pipeline.ensure, name="second", args=("slow", "smoke"),
                              kwargs={"root": tmp_path, "force": True})
    second.start()
    time.sleep(0.3)  # the second is now waiting for the lock
    started.clear()
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    kept = list((tmp_path / PREVIOUS_DIR).glob("slow-*"))
    assert len(kept) == 1 and (kept[0] / "weights.bin").read_text() == "first"
    assert (tmp_path / "slow" / "weights.bin").read_text() == "second"


# --- 27.3 settings checked before anything is touched; sizes before allocation -------------


@pytest.mark.parametrize("setting", ["seed=-1", f"seed={2**70}"])
def test_bad_settings_are_refused_before_finished_runs_are_touched(smoke_runs, tmp_path,
                                                                   capsys, setting):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    before = {p.name: (p / "stage.json").read_text() for p in root.iterdir() if p.is_dir()}
    assert main(["pretrain", "--profile", "smoke", "--out", str(root), "--set", setting]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert {p.name: (p / "stage.json").read_text() for p in root.iterdir() if p.is_dir()} == before
    assert not (root / "previous").exists()


@pytest.mark.parametrize("setting,words", [
    ("pretrain.max_steps=" + "9" * 20, "over the limit of 1,000,000,000"),
    ("train.num_workers=100000", "num_workers is 100,000, over the limit"),
])
def test_absurd_budgets_are_refused(capsys, setting, words):
    assert main(["plan", "--profile", "smoke", "--no-cpu-probe", "--set", setting]) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_an_absurd_model_size_is_refused_before_allocation(tmp_path, capsys):
    assert main(["pretrain", "--profile", "smoke", "--out", str(tmp_path / "runs"),
                 "--set", "model.hidden_size=1000000000", "--set",
                 "model.num_attention_heads=8"]) == 1
    err = capsys.readouterr().err
    assert "training pretrain (a model of" in err and "needs about" in err and "free" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("field,value", [("vocab_size", 10**9),
                                         ("max_position_embeddings", 10**9),
                                         ("num_hidden_layers", 10**6)])
def test_an_edited_config_json_is_refused_before_allocation(tmp_path, field, value):
    """(A folder whose weights carry our config is refused at once as edited; this one's
    weights, like a converted model's, carry none: only the size check stands in the way.)"""
    from minimind_lib.model.checkpoint import save_weights

    folder = _model_folder(tmp_path / "m")
    save_weights(load_model(folder), folder / "model.safetensors")  # no config in the header
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=r"config.json \(a model of [\d,]+ parameters\) needs "
                                         r"about .* free"):
        load_model(folder)


# --- 27.4 valid input that crashed ------------------------------------------------------


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory):
    from minimind_lib.tokenizer import load_tokenizer
    from minimind_lib.vision.clip import CLIP, CLIPConfig
    from minimind_lib.vision.vlm import build_vlm, save_vlm

    torch.manual_seed(0)
    lm = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1,
                                            max_position_embeddings=256))
    clip = CLIP(CLIPConfig(vision_width=16, vision_layers=1, vision_heads=2, text_width=16,
                           text_layers=1, text_heads=2, embed_dim=8, vocab_size=6400))
    folder = tmp_path_factory.mktemp("vision") / "vlm"
    save_vlm(build_vlm(lm, clip), folder)
    load_tokenizer().save_pretrained(folder)
    return folder


def test_chat_and_serve_load_a_vlm_folder(vlm_folder, capsys, monkeypatch):
    import minimind_lib.__main__ as cli

    args = cli.build_parser().parse_args(["serve", "--model", str(vlm_folder)])
    model, _ = cli.load_chosen_model(args)  # what serve runs before starting uvicorn
    assert "parameters)" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", "--model", str(vlm_folder), "--max-new-tokens", "3"]) == 0


@pytest.mark.parametrize("flag", ["--tools", "--think"])
def test_chat_tools_or_think_on_a_vlm_folder_is_a_user_error(vlm_folder, capsys, monkeypatch,
                                                              flag):
    """Issue 49.2: was ``'VisionLanguageModel' object has no attribute 'generate'`` at the
    first message."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", "--model", str(vlm_folder), flag]) == 1
    err = capsys.readouterr().err
    assert "vision-language model" in err and str(vlm_folder) in err
    assert "Traceback" not in err and "attribute" not in err


def _png_header(width, height, mode=0):
    """A PNG whose header says ``width`` x ``height`` (1-bit grey), its data one empty row:
    a few bytes that decode to an enormous picture."""
    import struct
    import zlib

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 1, mode, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * ((width + 7) // 8 + 1))) + chunk(b"IEND", b""))


def _gif_header(width, height):
    """A 1-frame GIF whose logical screen and image say ``width`` x ``height``."""
    import struct

    return (b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
            + b"," + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x4c\x01\x00;")


@pytest.mark.parametrize("kind,data", [
    ("png 200M pixels (a bomb)", lambda: _png_header(20000, 10000)),
    ("gif 4G pixels", lambda: _gif_header(65535, 65535)),
    ("png 12000 x 12000", lambda: _png_header(12000, 12000)),
])
def test_huge_pictures_are_400s_from_their_header(vlm_folder, kind, data):
    import base64

    from minimind_lib.inference.loading import load_for_serving

    vlm, tokenizer = load_for_serving(vlm_folder, "cpu")
    url = "data:image/png;base64," + base64.b64encode(data()).decode()
    message = [{"role": "user", "content": [{"type": "text", "text": "what?"},
                                            {"type": "image_url", "image_url": {"url": url}}]}]
    with BackgroundServer(create_app(vlm, tokenizer)) as s:
        r = httpx.post(s.url + CHAT, json={"messages": message, "max_tokens": 2}, timeout=60)
        error = openai_error(r, 400)
        assert "picture" in error["message"] and error["param"] == "messages[0].content"


def test_pictures_are_decoded_off_the_event_loop(vlm_folder, monkeypatch):
    import base64

    from minimind_lib.inference.loading import load_for_serving
    from minimind_lib.vision.pictures import data_url

    threads = record_threads(monkeypatch, serve_app, "image_from_data_url")
    vlm, tokenizer = load_for_serving(vlm_folder, "cpu")
    url = data_url(torch.zeros(64, 64, 3, dtype=torch.uint8).numpy())
    assert base64.b64decode(url.split(",")[1])[:4] == b"\x89PNG"
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    with BackgroundServer(create_app(vlm, tokenizer)) as s:
        r = httpx.post(s.url + CHAT, json={"messages": message, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and len(threads) == 1 and threads[0] != "uvicorn"


# --- 27.5 every bad file named ----------------------------------------------------------


def _course_tokenizer_dict():
    from minimind_lib.tokenizer import load_tokenizer

    return load_tokenizer().to_dict()


def _set_first_vocab_id(d, value):
    first = next(iter(d["model"]["vocab"]))
    d["model"]["vocab"][first] = value


def _share_an_id(d):
    names = list(d["model"]["vocab"])
    d["model"]["vocab"][names[300]] = d["model"]["vocab"][names[301]]


@pytest.mark.parametrize("name,mutate,words", [
    ("list", lambda d: [1, 2], "expected a JSON object, got a list"),
    ("string decoder", lambda d: {**d, "decoder": "x"}, "decoder must be an object or null"),
    ("merge 5", lambda d: (d["model"]["merges"].__setitem__(3, 5), d)[1], "model.merges[3]"),
    ("added token without id", lambda d: (d["added_tokens"][0].pop("id"), d)[1],
     "added_tokens[0]"),
    ("id 10**6", lambda d: (_set_first_vocab_id(d, 10**6), d)[1], "ids must be 0 .."),
    ("id -1", lambda d: (_set_first_vocab_id(d, -1), d)[1], "non-negative integer"),
    ("id '12'", lambda d: (_set_first_vocab_id(d, "12"), d)[1], "non-negative integer"),
    ("shared id", lambda d: (_share_an_id(d), d)[1], "is also"),
])
def test_a_broken_tokenizer_json_is_named(tmp_path, name, mutate, words):
    from minimind_lib.tokenizer import BPETokenizer

    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(mutate(_course_tokenizer_dict())), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        BPETokenizer.from_file(path)
    assert str(path) in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("raw,words", [(b'{"model": "\xff"}', "not UTF-8"),
                                       (b"[" * 100_000 + b"]" * 100_000, "nested too deeply")])
def test_an_unreadable_tokenizer_json_is_named(tmp_path, raw, words):
    from minimind_lib.tokenizer import BPETokenizer

    path = tmp_path / "tokenizer.json"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=words) as err:
        BPETokenizer.from_file(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("content", ["[]", "null", '"x"'])
def test_a_damaged_hash_cache_is_rebuilt_not_trusted(tmp_path, content):
    from minimind_lib.course.pipeline import HASH_CACHE, file_hash

    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hi"}\n')
    (tmp_path / HASH_CACHE).write_text(content)
    import hashlib
    assert file_hash(data, tmp_path) == hashlib.sha256(data.read_bytes()).hexdigest()


def test_a_truncated_stage_json_is_named_in_one_line(smoke_runs, tmp_path, capsys):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    marker = root / "pretrain" / "stage.json"
    marker.write_text(marker.read_text()[:40])
    assert main(["sft", "--profile", "smoke", "--out", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"{marker}: not valid JSON" in err and "move or delete" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("raw,words", [(b"[sft]\nlearning_rate = \xff\n", "not UTF-8"),
                                       (b"a = " + b"[" * 3000 + b"]" * 3000, "nested too deeply")])
def test_a_broken_config_toml_is_named(tmp_path, capsys, raw, words):
    path = tmp_path / "run.toml"
    path.write_bytes(raw)
    assert main(["plan", "--profile", "smoke", "--no-cpu-probe", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and words in err and err.count("\n") == 1


def test_a_full_disk_is_named_and_leaves_no_temporaries(tmp_path, monkeypatch):
    """Simulated: safetensors fails mid-write while the disk has no space left (the real thing
    on a tiny tmpfs: ``test_a_real_full_disk``)."""
    import shutil

    import minimind_lib.core.atomic as atomic
    from minimind_lib.model import checkpoint

    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1,
                                               max_position_embeddings=64))

    def failing_write(module, filename, **kwargs):
        open(filename, "wb").write(b"x" * 100)
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")

    monkeypatch.setattr(checkpoint.safetensors.torch, "save_model", failing_write)
    monkeypatch.setattr(atomic.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(OSError, match="No space left on device") as err:
        save_checkpoint(tmp_path, 5, model, {"step": 5})
    assert "step_0000005" in str(err.value)
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no step_*.tmp-* folder


def test_a_real_full_disk(tmp_path):
    """On a 1 MB tmpfs (where this machine lets the tests mount one)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): the simulated case above runs")
    try:
        model = MiniMindForCausalLM(MiniMindConfig(hidden_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4))  # ~7 MB of weights
        with pytest.raises(OSError, match="No space left on device") as err:
            save_model(model, mount / "m")
        assert str(mount / "m") in str(err.value)
        assert [p.name for p in (mount / "m").iterdir()] in ([], ["config.json"])
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_stale_temporary_of_a_killed_run_is_removed(tmp_path):
    from minimind_lib.core.atomic import atomic_write_text

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    stale = tmp_path / f"metrics.json.tmp-{dead.pid}"
    stale.write_text("half")
    mine = tmp_path / f"metrics.json.tmp-{1}"  # pid 1 runs: not ours to remove
    mine.write_text("someone's")
    atomic_write_text(tmp_path / "metrics.json", "{}")
    assert not stale.exists() and mine.exists()


# --- 27.6 server edges ------------------------------------------------------------------


def test_a_non_ascii_api_key_is_refused_at_startup(model, tok, capsys, monkeypatch, tmp_path):
    from minimind_lib.inference.serve.launch import free_port

    with pytest.raises(ValueError, match="printable ASCII"):
        create_app(model, tok, api_key="clé-secrète")
    monkeypatch.setenv("MINIMIND_API_KEY", "clé")  # (no model there: a server never starts)
    assert main(["serve", "--port", str(free_port()), "--model", str(tmp_path / "none")]) == 1
    assert "printable ASCII" in capsys.readouterr().err


def test_an_empty_api_key_is_refused_at_startup_not_ignored(capsys, tmp_path):
    """Issue 49: ``serve --api-key ""`` started without a key, silently."""
    from minimind_lib.inference.serve.launch import free_port

    assert main(["serve", "--port", str(free_port()), "--model", str(tmp_path / "none"),
                 "--api-key", ""]) == 1
    assert "--api-key is empty" in capsys.readouterr().err


def test_docs_are_not_served_and_the_schema_needs_the_key(model, tok):
    with BackgroundServer(create_app(model, tok, api_key="k3y")) as s:
        assert httpx.get(s.url + "/docs").status_code == 404
        assert httpx.get(s.url + "/redoc").status_code == 404
        assert httpx.get(s.url + "/openapi.json").status_code == 401
        r = httpx.get(s.url + "/openapi.json", headers={"Authorization": "Bearer k3y"})
        assert r.status_code == 200 and "/v1/chat/completions" in r.json()["paths"]
        assert httpx.get(s.url + "/").status_code == 200  # the page itself stays open


def test_a_keyless_loopback_server_answers_only_to_localhost_names(model, tok):
    from minimind_lib.inference.serve.app import LOOPBACK_HOSTS

    with BackgroundServer(create_app(model, tok, allowed_hosts=LOOPBACK_HOSTS)) as s:
        assert httpx.get(s.url + "/v1/models").status_code == 200
        r = httpx.get(s.url + "/v1/models", headers={"Host": "attacker.example:8998"})
        assert "DNS rebinding" in openai_error(r, 400)["message"]
        assert httpx.get(s.url + "/", headers={"Host": "localhost:8998"}).status_code == 200


def test_the_chat_page_has_a_content_security_policy(server):
    r = httpx.get(server.url + "/")
    policy = r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    assert "script-src 'sha256-" in policy and "cdn" not in r.text.lower()
    assert r.headers["x-frame-options"] == "DENY"


def test_slow_request_heads_are_cut_off(model, tok, monkeypatch):
    from minimind_lib.inference.serve import launch

    monkeypatch.setattr(launch, "HEADERS_TIMEOUT_SECONDS", 0.5)
    with BackgroundServer(create_app(model, tok)) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as slow:
            slow.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            start = time.monotonic()
            assert slow.recv(100) == b""  # closed by the server
            assert time.monotonic() - start < 8
        assert httpx.get(s.url + "/v1/models").status_code == 200  # a normal client still is


@pytest.mark.parametrize("field,value", [("temperature", True), ("max_tokens", "2"),
                                         ("stream", "yes"), ("top_k", "2"), ("seed", "1")])
def test_request_fields_have_strict_json_types(server, field, value):
    r = httpx.post(server.url + CHAT, json={"messages": user("hi"), field: value}, timeout=60)
    assert openai_error(r, 400)["param"] == field


def test_an_int_temperature_is_still_a_number(server):
    r = httpx.post(server.url + CHAT, json={"messages": user("hi"), "temperature": 0,
                                            "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_start_model_with_another_tokenizer_is_refused_by_name(tmp_path):
    """A model folder trained with other token ids (a reference from before the course
    tokenizer reserved MiniMind-3's markers) would be fed tokens it never learned."""
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stages import StageContext
    from minimind_lib.tokenizer import load_tokenizer, train_bpe

    (tmp_path / "tokenizer").mkdir()
    load_tokenizer().save(tmp_path / "tokenizer" / "tokenizer.json")
    old = tmp_path / "old_model"
    train_bpe(["some other text"], 300, show_progress=False).save(old / "tokenizer.json")
    ctx = StageContext("dpo", get_profile("smoke"), tmp_path, init=old)
    with pytest.raises(ValueError, match="old_model: its model was trained with another "
                                         "tokenizer than this run's"):
        ctx.start_dir()
    load_tokenizer().save(old / "tokenizer.json")
    assert ctx.start_dir() == old


def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closes(model, tok):
    """Issue 49: a partial POST stayed open past 45 s (uvicorn bounds headers, not bodies)."""
    import socket
    import time

    with BackgroundServer(create_app(model, tok, body_timeout=1.0)) as s:
        host, port = s.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                         b'{"messages": ')
            start = time.monotonic()
            reply = b""
            while chunk := conn.recv(4096):  # until the server closes the connection
                reply += chunk
            assert time.monotonic() - start < 8
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply
        ok = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ok.status_code == 200  # a whole body is read as before
