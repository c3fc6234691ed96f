"""Reliability probes (issue #15): the server, the files and the CLI under bad input and
abandoned clients, run against one or two source trees side by side.

    python benchmarks/hardening_probes.py                        # this tree
    python benchmarks/hardening_probes.py --before /tmp/main     # a table: before | after

``--before`` is another checkout of the project (e.g. ``git archive main | tar -x -C DIR``).
Each tree runs in its own processes (``PYTHONPATH=<tree>``, started outside both trees), on
the same small model (hidden 64, 2 layers, the course tokenizer, context 4,096, random
weights: what is probed is the serving, not the answers). Servers run on 127.0.0.1 with one
torch thread. The probes:

* abandoned clients: 16 clients give up after 0.2 s on ``max_tokens`` 2,000; how long a
  following 4-token request then takes;
* big prompts: a 1 MB and a 10 MB prompt (random words), while another client polls
  ``GET /v1/models`` every 20 ms: the big request's status, the longest poll, the server's RSS
  after;
* 64 concurrent greedy requests against the same 64 sent one at a time (answers that differ);
* RSS after 100 and after 1,100 requests (flat = no leak);
* request bodies: status and error shape of each bad request; whether the next request on the
  same keep-alive connection still works;
* files: broken data lines, damaged / edited / NaN checkpoints, a torn metrics line on resume;
* the CLI: exit code and whether a traceback is printed;
* kill -9 during ``save_checkpoint`` (25 times): is the latest checkpoint still loadable?

And issue #27's two that need timing:

* a slow-headers flood: 10,000 connections that send half a request head and wait; the
  server's open sockets at once and 12 s later, and a normal request then;
* 16 big pictures at once (12000 x 12000, a 1-bit PNG of a few KB each) to a VLM server,
  while another client polls ``GET /v1/models``: their statuses, the longest poll, the
  server's peak RSS; and one 200 M-pixel "decompression bomb" (a 1-bit PNG of ~50 KB).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHAT = "/v1/chat/completions"
CONTEXT = 4096


# --------------------------------------------------------------------------- helpers


def tree_env(tree: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1",
            "MINIMIND_PROFILE": "smoke", "PYTHONIOENCODING": "utf-8"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def outcome(fn) -> str:
    """What ``fn()`` did: its result, or the exception's type and message (shortened)."""
    try:
        return str(fn())
    except BaseException as e:  # noqa: BLE001 - a probe reports whatever happened
        return f"{type(e).__name__}: {' '.join(str(e).split())}"[:110]


def shape(r) -> str:
    """A response as ``status body-shape``."""
    kind = r.headers.get("content-type", "").split(";")[0]
    if kind != "application/json":
        return f"{r.status_code} {kind or 'no body'}"
    body = r.json()
    key = next(iter(body), "") if isinstance(body, dict) else ""
    return f"{r.status_code} {{{key}}}" if key in ("error", "detail") else f"{r.status_code} ok"


def make_model_dir(root: Path) -> Path:
    import torch

    from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    from minimind_lib.model.checkpoint import save_model
    from minimind_lib.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CONTEXT))
    save_model(model, root / "model")
    tokenizer.save(root / "model" / "tokenizer.json")
    return root / "model"


class Server:
    """``python -m minimind_lib serve`` of a tree, in a subprocess; ``direct=True`` starts
    ``create_app`` under plain uvicorn instead (what a tree whose CLI cannot load the model,
    e.g. a VLM folder before issue #27, still serves)."""

    def __init__(self, tree: Path, model_dir: Path, direct: bool = False) -> None:
        import httpx

        from minimind_lib.inference.serve.launch import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = ([sys.executable, "-c", DIRECT_SERVER, str(model_dir), str(self.port)] if direct
                   else [sys.executable, "-m", "minimind_lib", "serve", "--model", str(model_dir),
                         "--port", str(self.port), "--device", "cpu"])
        self.proc = subprocess.Popen(command, env=tree_env(tree), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        for _ in range(600):
            try:
                httpx.get(self.url + "/v1/models", timeout=1)
                return
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        raise RuntimeError("the server did not start")

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


DIRECT_SERVER = """
import sys, uvicorn
from minimind_lib.inference.loading import load_for_serving
from minimind_lib.inference.serve.app import create_app
model, tokenizer = load_for_serving(sys.argv[1], "cpu")
uvicorn.run(create_app(model, tokenizer), host="127.0.0.1", port=int(sys.argv[2]),
            log_level="warning")
"""


def words(n_chars: int) -> str:
    """``n_chars`` of seeded random lowercase words: text the tokenizer's word cache cannot
    shortcut (a repeated sentence would be encoded once and then looked up)."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out, size = [], 0
    while size < n_chars:
        word = "".join(rng.choices(letters, k=rng.randint(2, 9)))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_chars]


def chat(text: str, max_tokens: int, **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


# --------------------------------------------------------------------------- server probes


def probe_abandoned(tree: Path, model_dir: Path) -> dict:
    import httpx

    with Server(tree, model_dir) as s:
        def give_up(i: int) -> None:
            try:
                httpx.post(s.url + CHAT, json=chat(f"q{i}", 2000), timeout=0.2)
            except httpx.TimeoutException:
                pass

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(give_up, range(16)))
        start = time.perf_counter()
        r = httpx.post(s.url + CHAT, json=chat("hi", 4), timeout=600)
        took = time.perf_counter() - start
    return {"16 abandoned 2,000-token requests, then a 4-token one":
            f"{r.status_code} after {took:.1f} s"}


def probe_big_prompts(tree: Path, model_dir: Path) -> dict:
    import httpx

    rows = {}
    with Server(tree, model_dir) as s:
        for mb in (1, 10):
            text = words(mb << 20)
            body = chat(text, 4)
            result = concurrent.futures.ThreadPoolExecutor(1).submit(
                outcome, lambda body=body: shape(httpx.post(s.url + CHAT, json=body, timeout=600)))
            worst = 0.0
            while not result.done():
                start = time.perf_counter()
                httpx.get(s.url + "/v1/models", timeout=600)
                worst = max(worst, time.perf_counter() - start)
                time.sleep(0.02)
            rows[f"{mb} MB prompt: its answer; longest other request meanwhile; server RSS"] = (
                f"{result.result()}; {worst:.2f} s; {rss_mb(s.proc.pid):.0f} MB")
    return rows


def probe_concurrency_and_memory(tree: Path, model_dir: Path) -> dict:
    import httpx

    with Server(tree, model_dir) as s, httpx.Client(base_url=s.url, timeout=600) as client:
        bodies = [chat(f"question {i}: what is {i} + {i}?", 12) for i in range(64)]
        alone = [client.post(CHAT, json=b).json()["choices"][0]["message"] for b in bodies]
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            together = list(pool.map(
                lambda b: httpx.post(s.url + CHAT, json=b, timeout=600).json()["choices"][0][
                    "message"], bodies))
        wrong = sum(a != t for a, t in zip(alone, together, strict=True))
        for i in range(100):
            client.post(CHAT, json=chat(f"warm-up {i}", 8))
        before = rss_mb(s.proc.pid)
        for i in range(1000):
            client.post(CHAT, json=chat(f"request {i}", 8))
        after = rss_mb(s.proc.pid)
    return {"64 concurrent greedy requests: answers unlike the same request alone": f"{wrong}/64",
            "server RSS after 100 requests -> after 1,100": f"{before:.0f} -> {after:.0f} MB"}


BAD_BODIES = {
    "temperature 1e-40": json.dumps(chat("hi", 3, temperature=1e-40)),
    "top_p 1e-46": json.dumps(chat("hi", 3, temperature=1.0, top_p=1e-46)),
    "seed 2**64": json.dumps(chat("hi", 3, temperature=1.0, seed=2**64)),
    "seed -2**70": json.dumps(chat("hi", 3, temperature=1.0, seed=-2**70)),
    "temperature NaN": json.dumps(chat("hi", 3, temperature=float("nan"))),
    "temperature 1e400 (inf)": json.dumps(chat("hi", 3)).replace('"temperature": 0',
                                                                  '"temperature": 1e400'),
    "content \\ud800 (lone surrogate)": json.dumps(chat("\ud800", 3)),
    "body not UTF-8": b'{"messages": [{"role": "user", "content": "\xff"}]}',
    "JSON nested 100k deep": "[" * 100_000 + "]" * 100_000,
    "role developer": json.dumps({**chat("hi", 3),
                                  "messages": [{"role": "developer", "content": "hi"}]}),
}


def probe_bodies(tree: Path, model_dir: Path) -> dict:
    import httpx

    rows = {}
    with Server(tree, model_dir) as s:
        for name, body in BAD_BODIES.items():
            rows[f"request: {name}"] = outcome(lambda body=body: shape(httpx.post(
                s.url + CHAT, content=body, headers={"content-type": "application/json"},
                timeout=60)))
        rows["request: GET /nothing"] = outcome(lambda: shape(httpx.get(s.url + "/nothing")))
        with httpx.Client(base_url=s.url, timeout=60) as client:
            first = outcome(lambda: shape(client.post(
                CHAT, content=BAD_BODIES["top_p 1e-46"],
                headers={"content-type": "application/json"})))
            second = outcome(lambda: shape(client.get("/v1/models")))
        rows["keep-alive: the top_p 1e-46 request, then the next one on its connection"] = (
            f"{first}; then {second}")
    return rows


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def probe_slow_headers(tree: Path, model_dir: Path, n: int = 10_000) -> dict:
    import httpx

    with Server(tree, model_dir) as s:
        held = []
        for _ in range(n):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            held.append(c)
        time.sleep(1)
        at_once = open_fds(s.proc.pid)
        time.sleep(11)
        later = open_fds(s.proc.pid)
        start = time.perf_counter()
        normal = outcome(lambda: shape(httpx.get(s.url + "/v1/models", timeout=30)))
        took = time.perf_counter() - start
        for c in held:
            c.close()
    return {f"{n:,} half-open requests: server's open files at once -> 12 s later; a normal "
            "request then": f"{at_once:,} -> {later:,}; {normal} in {took:.2f} s"}


def make_vlm_dir(root: Path) -> Path:
    import torch

    from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    from minimind_lib.tokenizer import load_tokenizer
    from minimind_lib.vision.clip import CLIP, CLIPConfig
    from minimind_lib.vision.vlm import build_vlm, save_vlm

    tokenizer = load_tokenizer()
    torch.manual_seed(0)
    lm = MiniMindForCausalLM(MiniMindConfig(vocab_size=len(tokenizer), hidden_size=64,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, max_position_embeddings=512))
    clip = CLIP(CLIPConfig(vocab_size=len(tokenizer)))
    save_vlm(build_vlm(lm, clip), root / "vlm")
    tokenizer.save(root / "vlm" / "tokenizer.json")
    return root / "vlm"


def png_url(width: int, height: int) -> str:
    """A black 1-bit PNG of ``width`` x ``height`` as a data URL (it compresses to a few KB)."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def picture_chat(url: str) -> dict:
    parts = [{"type": "text", "text": "what colour?"},
             {"type": "image_url", "image_url": {"url": url}}]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2, "temperature": 0}


def probe_big_pictures(tree: Path, work: Path) -> dict:
    import httpx

    big, bomb = png_url(12000, 12000), png_url(20000, 10000)
    rows = {}
    with Server(tree, make_vlm_dir(work), direct=True) as s:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            sent = [pool.submit(outcome, lambda: shape(httpx.post(s.url + CHAT, json=picture_chat(
                big), timeout=600))) for _ in range(16)]
            worst = 0.0
            while not all(f.done() for f in sent):
                start = time.perf_counter()
                httpx.get(s.url + "/v1/models", timeout=600)
                worst = max(worst, time.perf_counter() - start)
                time.sleep(0.02)
        statuses = sorted({f.result() for f in sent})
        rows[f"16 pictures of 12000 x 12000 ({len(big) // 1024} KB each) at once: answers; "
             "longest other request meanwhile; server peak RSS"] = (
            f"{', '.join(statuses)}; {worst:.2f} s; {peak_rss_mb(s.proc.pid):.0f} MB")
        rows[f"a 200 M-pixel PNG ({len(bomb) // 1024} KB)"] = outcome(lambda: shape(httpx.post(
            s.url + CHAT, json=picture_chat(bomb), timeout=600)))
    return rows


# --------------------------------------------------------------------------- file probes


def probe_files(work: Path) -> dict:
    import torch

    from minimind_lib.data import read_jsonl
    from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    from minimind_lib.model.checkpoint import load_model, save_model
    from minimind_lib.tokenizer import load_tokenizer

    rows = {}
    data = work / "x.jsonl"

    def read(lines: bytes, schema: str = "pretrain") -> str:
        data.write_bytes(lines)
        records = list(read_jsonl(data, schema))
        tokenizer = load_tokenizer()  # what a stage does next
        for r in records:
            tokenizer.encode_batch([r.get("text", "")], allowed_special="all")
        return f"{len(records)} records read"

    rows["data: a line with byte 0xff"] = outcome(
        lambda: read(b'{"text": "a"}\n{"text": "\xff"}\n'))
    rows["data: JSON nested 100k deep"] = outcome(lambda: read(b"[" * 100_000 + b"]" * 100_000))
    rows["data: text with \\ud800"] = outcome(lambda: read(b'{"text": "a \\ud800"}\n'))

    config = MiniMindConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=64)

    def folder(name: str, edit: dict | None = None, nan: bool = False,
               cut: bool = False) -> str:
        torch.manual_seed(0)
        model = MiniMindForCausalLM(config)
        if nan:
            with torch.no_grad():
                model.lm_head.weight[0, 0] = float("nan")
        d = save_model(model, work / name)
        if edit:
            path = d / "config.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
        if cut:
            weights = d / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:1000])
        load_model(d)
        return "loaded silently"

    rows["checkpoint: model.safetensors cut short"] = outcome(lambda: folder("cut", cut=True))
    rows["checkpoint: hidden_size 32.0"] = outcome(lambda: folder("f", {"hidden_size": 32.0}))
    rows["checkpoint: rms_norm_eps -1"] = outcome(lambda: folder("e", {"rms_norm_eps": -1}))
    rows["checkpoint: rope_theta changed"] = outcome(lambda: folder("r", {"rope_theta": 1e4}))
    rows["checkpoint: max_position_embeddings changed"] = outcome(
        lambda: folder("m", {"max_position_embeddings": 128}))
    rows["checkpoint: a NaN weight"] = outcome(lambda: folder("n", nan=True))
    rows["resume after a torn metrics.jsonl line"] = outcome(lambda: torn_resume(work, config))
    return rows


def torn_resume(work: Path, config) -> str:
    import torch

    from minimind_lib.model import MiniMindForCausalLM
    from minimind_lib.training import TrainConfig, train

    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (16, 17))]

    def run(steps: int, resume: bool) -> list:
        cfg = TrainConfig(batch_size=4, max_steps=steps, warmup_steps=1, save_every=2,
                          precision="fp32", progress=False, device="cpu", out_dir=work / "run")
        return train(MiniMindForCausalLM(config), data, cfg, resume=resume)

    run(4, False)
    with (work / "run" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "lo')
    return f"resumed: steps {[r['step'] for r in run(6, True)]}"


# --------------------------------------------------------------------------- CLI probes


def probe_cli(tree: Path, model_dir: Path, work: Path) -> dict:
    (work / "a_file").write_text("")
    cases = {
        "MINIMIND_PROFILE=bogus pretrain": (["pretrain"], {"MINIMIND_PROFILE": "bogus"}, ""),
        "serve --port 99999": (["serve", "--model", str(model_dir), "--port", "99999"], {}, ""),
        "pretrain --out under a file": (["pretrain", "--out", str(work / "a_file" / "x")], {}, ""),
        "chat --model missing": (["chat", "--model", str(work / "missing")], {}, ""),
        "chat --temperature nan": (["chat", "--model", str(model_dir), "--temperature", "nan"],
                                   {}, "hi\n/exit\n"),
        "chat: an over-long message, then 'hi'": (
            ["chat", "--model", str(model_dir), "--max-new-tokens", "4"], {},
            "fox " * 20_000 + "\nhi\n/exit\n"),
    }
    rows = {}
    for name, (argv, env, stdin) in cases.items():
        out = subprocess.run([sys.executable, "-m", "minimind_lib", *argv], input=stdin,
                             capture_output=True, text=True, timeout=600, cwd=work,
                             env={**tree_env(tree), **env})
        answers = out.stdout.count("minimind> ")
        rows[f"cli: {name}"] = (f"exit {out.returncode}, "
                                f"{'traceback' if 'Traceback' in out.stderr else 'no traceback'}"
                                + (f", {answers} answers" if "chat" in argv else ""))
    return rows


# --------------------------------------------------------------------------- kill -9


SAVER = """
import sys, torch
from minimind_lib.model.checkpoint import save_checkpoint
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
model = MiniMindForCausalLM(MiniMindConfig(vocab_size=6400, hidden_size=128, num_hidden_layers=4,
                                           num_attention_heads=4, num_key_value_heads=2))
step = 0
while True:
    step += 1
    save_checkpoint(sys.argv[1], step, model, {"step": step})
"""


def probe_kill9(tree: Path, work: Path, trials: int = 25) -> dict:
    import torch

    from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
    from minimind_lib.model.checkpoint import latest_checkpoint, load_checkpoint

    model = MiniMindForCausalLM(MiniMindConfig(vocab_size=6400, hidden_size=128,
                                               num_hidden_layers=4, num_attention_heads=4,
                                               num_key_value_heads=2))
    rng, survived, killed_mid = random.Random(0), 0, 0
    for trial in range(trials):
        out = work / f"kill{trial}"
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(out)], env=tree_env(tree))
        while latest_checkpoint(out) is None:  # the first save finished
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_mid += any(".tmp-" in p.name for p in out.rglob("*"))
        state = outcome(lambda out=out: load_checkpoint(latest_checkpoint(out), model))
        survived += state.startswith("{") and torch.isfinite(model.lm_head.weight).all().item()
    return {f"kill -9 during save_checkpoint ({trials}x): latest loads": (
        f"{survived}/{trials} (mid-write in {killed_mid})")}


# --------------------------------------------------------------------------- running it


PROBES = {  # name -> probe(tree, model_dir, work)
    "probe_abandoned": lambda tree, model, work: probe_abandoned(tree, model),
    "probe_big_prompts": lambda tree, model, work: probe_big_prompts(tree, model),
    "probe_concurrency_and_memory": lambda tree, model, work: probe_concurrency_and_memory(
        tree, model),
    "probe_bodies": lambda tree, model, work: probe_bodies(tree, model),
    "probe_slow_headers": lambda tree, model, work: probe_slow_headers(tree, model),
    "probe_big_pictures": lambda tree, model, work: probe_big_pictures(tree, work),
    "probe_files": lambda tree, model, work: probe_files(work),
    "probe_cli": lambda tree, model, work: probe_cli(tree, model, work),
    "probe_kill9": lambda tree, model, work: probe_kill9(tree, work),
}


def worker(tree: Path, only: list[str] | None) -> dict:
    """The probes (``only`` these, when given) against ``tree`` (this process imports
    minimind_lib from it)."""
    import torch

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="probes-"))
    model_dir = make_model_dir(work)
    rows: dict = {}
    for name, probe in PROBES.items():
        if only is None or name in only:
            rows |= probe(tree, model_dir, work)
            print(f"[{tree}] {name} done", file=sys.stderr, flush=True)
    return rows


def run_tree(tree: Path, only: list[str] | None) -> dict:
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(tree),
                          *(["--only", *only] if only else [])],
                         env=tree_env(tree), capture_output=True, text=True,
                         cwd=tempfile.gettempdir(), check=False)
    sys.stderr.write(out.stderr[-4000:])
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, default=None, help="another source tree")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", default=None,
                        help="run only these probes (e.g. probe_slow_headers)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.only)))
        return
    trees = {"after (this tree)": HERE.parent}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    unknown = set(args.only or ()) - set(PROBES)
    if unknown:
        parser.error(f"unknown probes {sorted(unknown)}; probes: {', '.join(PROBES)}")
    results = {name: run_tree(tree, args.only) for name, tree in trees.items()}
    names = list(trees)
    print("| probe | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for row in results[names[-1]]:
        cells = [results[n].get(row, "-").replace("|", "/") for n in names]
        print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
