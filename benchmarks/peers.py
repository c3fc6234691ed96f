"""The course's speed against its own past and against the references, side by side in one run.

Each section times the two sides in alternating rounds in this one process and prints ratios
(no timing is asserted anywhere in the tests). Torch runs on ``--threads`` threads (default 1):
on a CPU shared with other jobs, multi-threaded timings swing by 10x. ``--clock cpu`` (default)
times the process's CPU time, which other jobs do not inflate; the server section always uses
wall time (its work is spread over threads and sockets).

1. ``eval``: greedy answers to the held-out questions of the cpu profile (12 tasks x 100 =
   1,200, the shipped reference model ``data/reference/sft``): ``generate_answers`` today
   (continuous batching over a static cache, ``model.generation.generate_many``) against the
   code before issue 32 (batches of prompts of one token length, a concatenating cache, rows
   computed to the end of the batch: ``legacy_answers`` below). Same answers, checked.
2. ``decode``: batch-1 greedy decode, ours vs transformers' ``LlamaForCausalLM`` (same weights)
   and MiniMind's own model code (``--minimind DIR``, a checkout of jingyaogong/minimind: today
   MiniMind-3's, with QK-norm), at the cpu profile's size and MiniMind2-Small's, with the memory
   roofline: weight bytes read per token x tokens/s against a copy's measured bandwidth.
3. ``server``: 16 greedy chat requests at once vs one after another, same answers.
4. ``compile``: ``--set train.compile=true`` and ``serve --compile`` against eager.
5. ``train``: bytes autograd saves and step time vs HF's Llama (``peers_train.py``).
The BPE trainer's ratio is ``tokenizer_bench.py``'s.

Usage: ``python benchmarks/peers.py [--sections eval,decode,...] [--reps N] [--threads T]
[--minimind DIR]`` (about 15 min of CPU time); the load average is printed before and after
each section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model_bench, peers_train
from model_bench import train_step_fn  # noqa: E402

from minimind_lib import DATA_DIR  # noqa: E402
from minimind_lib.course.profiles import get_profile  # noqa: E402
from minimind_lib.evaluation.questions import (  # noqa: E402
    Answer,
    answer_budget,
    generate_answers,
    load_eval_records,
    prompt_messages,
    select_per_task,
)
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
from minimind_lib.model.checkpoint import load_model  # noqa: E402
from minimind_lib.model.hf import to_hf  # noqa: E402
from minimind_lib.tokenizer.bpe import load_tokenizer  # noqa: E402
from minimind_lib.tokenizer.chat import encode_chat  # noqa: E402
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END  # noqa: E402

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]
REFERENCE = DATA_DIR / "reference" / "sft"


def load() -> str:
    return "load average " + " ".join(open("/proc/loadavg").read().split()[:3])


def alternate(fns: dict[str, Callable[[], object]], reps: int) -> tuple[dict[str, float], dict]:
    """Median seconds per call of each function, calls interleaved in A B B A order; and the
    last result of each."""
    times: dict[str, list[float]] = defaultdict(list)
    results = {}
    order = list(fns.items())
    for rep in range(reps):
        for name, fn in order if rep % 2 == 0 else reversed(order):
            start = clock()
            results[name] = fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}, results


# --- 1. evaluation ---------------------------------------------------------------------------


@torch.inference_mode()
def legacy_answers(model, tokenizer, questions, max_new_tokens: int,
                   batch_size: int = 64) -> list[Answer]:
    """``generate_answers`` as it was before issue 32 (commit e91c495): prompts of one token
    length per batch, the cache grown by ``torch.cat`` every token, every row computed until the
    whole batch has ended."""
    end_turn, end_text = tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": q}] if isinstance(q, str)
                           else list(q), add_generation_prompt=True) for q in questions]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    batches = [idx[k:k + batch_size] for _, idx in sorted(by_length.items())
               for k in range(0, len(idx), batch_size)]
    model.eval()
    answers: list[Answer | None] = [None] * len(prompts)
    for idx in batches:
        seq = torch.tensor([prompts[i] for i in idx])  # (B, T)
        cache, fed, steps = None, seq, []
        done = torch.zeros(len(idx), dtype=torch.bool)
        for _ in range(max_new_tokens):
            out = model(fed, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = out.logits[:, -1].float().argmax(-1)  # (B,)
            token = token.masked_fill(done, end_turn)
            steps.append(token)
            done |= (token == end_turn) | (token == end_text)
            if bool(done.all()):
                break
            fed = token[:, None]
        new = torch.stack(steps, dim=1).tolist()
        for i, row in zip(idx, new, strict=True):
            stop = next((k for k, t in enumerate(row) if t in (end_turn, end_text)), len(row))
            answers[i] = Answer(tokenizer.decode(row[:stop]),
                                stop < len(row) and row[stop] == end_turn)
    return answers


def bench_eval(reps: int, minimind_dir: str | None = None) -> None:
    model = load_model(REFERENCE).eval()
    tokenizer = load_tokenizer(REFERENCE / "tokenizer.json")
    records = select_per_task(load_eval_records(), 100)
    questions = [prompt_messages(r) for r in records]
    budget = answer_budget(tokenizer, records)
    times, results = alternate({
        "before": lambda: legacy_answers(model, tokenizer, questions, budget),
        "today": lambda: generate_answers(model, tokenizer, questions, budget, progress=False),
    }, reps)
    same = results["before"] == results["today"]
    print(f"1. evaluation: {len(questions):,} held-out questions, greedy, budget {budget} "
          f"tokens, the reference model (median of {reps}, {clock.__name__}):")
    print(f"   before issue 32 {times['before']:7.2f} s   today {times['today']:7.2f} s   "
          f"speed-up {times['before'] / times['today']:.2f}x  (goal >= 3x)   same answers: "
          f"{same}")


# --- 2. batch-1 decode and its memory roofline ------------------------------------------------


def memory_bandwidth(mbytes: int = 256, reps: int = 5) -> float:
    """Bytes per second one thread moves copying a tensor far larger than the caches (read +
    write counted), the best of ``reps``: what decode's weight reads can hope for."""
    src = torch.ones(mbytes << 18)  # mbytes MiB of fp32
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every matrix once, but of the embedding table
    only one row (unless it is tied to the output head, which reads all of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.model.embed_tokens.weight, model.lm_head.weight
    if emb is not head:
        total -= emb.numel() * emb.element_size() - emb.shape[1] * emb.element_size()
    return total


def bench_decode(reps: int, minimind_dir: str | None = None) -> None:
    bandwidth = memory_bandwidth()
    print(f"2. batch-1 greedy decode, 128 new tokens after a 16-token prompt (median of {reps}, "
          f"{clock.__name__}); memory bandwidth measured here (1 thread, copy): "
          f"{bandwidth / 1e9:.1f} GB/s")
    decode_size("cpu profile", get_profile("cpu").model, 2.0, reps, bandwidth, minimind_dir)
    decode_size("MiniMind2-Small", MiniMindConfig(), 1.3, reps, bandwidth, minimind_dir)


def decode_size(name: str, config: MiniMindConfig, goal: float, reps: int, bandwidth: float,
                minimind_dir: str | None) -> None:
    from peers_train import minimind_model

    torch.manual_seed(0)
    ours = MiniMindForCausalLM(config).eval()
    prompt = torch.randint(3, config.vocab_size, (1, 16))

    def hf_style(model: torch.nn.Module) -> Callable[[], torch.Tensor]:
        return lambda: model.generate(prompt, max_new_tokens=128, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)

    sides = {"ours": lambda: ours.generate(prompt, 128, temperature=0),
             "hf": hf_style(to_hf(ours, attn_implementation="sdpa").eval())}
    peer = minimind_model(minimind_dir, ours)
    if isinstance(peer, torch.nn.Module):
        sides["minimind"] = hf_style(peer.eval())
    for fn in sides.values():
        fn()  # warm-up
    times, outs = alternate(sides, reps)
    same = torch.equal(outs["ours"], outs["hf"])
    per_token = weight_bytes_per_token(ours)
    print(f"   {name} ({ours.num_parameters() / 1e6:.1f}M, {per_token / 1e6:.1f} MB of weights "
          "read a token):")
    for side, t in times.items():
        speed = 128 / t
        print(f"     {side:9s} {speed:7.1f} tok/s   roofline fraction "
              f"{per_token * speed / bandwidth:5.1%}")
    # MiniMind's code today is MiniMind-3's: it adds QK-norm, so its tokens are not ours
    versus = (f"ours / MiniMind {times['minimind'] / times['ours']:.2f}x (with QK-norm)"
              if "minimind" in times else f"(MiniMind: {peer})")
    print(f"     ours / HF {times['hf'] / times['ours']:.2f}x (goal >= {goal}x)   {versus}   "
          f"same tokens as HF: {same}")


# --- 3. the server: concurrent requests decode together -------------------------------------


def bench_server(reps: int, minimind_dir: str | None = None) -> None:
    """16 greedy chat requests to one server: all at once vs one after another (wall clock:
    the server's work is spread over its threads and the sockets). Two loads: the held-out
    questions to the reference model (short answers: mostly prompt reading), and 64-token
    answers from an untrained model of the cpu profile's size (it never says a stop token, so
    every answer runs its whole budget: the decode-bound case, as ``--ignore-eos`` in vLLM's
    benchmark)."""
    model = load_model(REFERENCE).eval()
    tokenizer = load_tokenizer(REFERENCE / "tokenizer.json")
    records = select_per_task(load_eval_records(), 2)[:16]
    budget = answer_budget(tokenizer, records)
    questions = [prompt_messages(r) for r in records]
    print(f"3. server: 16 greedy chat requests at once vs one after another, wall clock "
          f"(median of {reps}):")
    serve_load(f"held-out questions, the reference model, max_tokens {budget}", model, tokenizer,
               questions, budget, reps)
    torch.manual_seed(0)
    untrained = MiniMindForCausalLM(get_profile("cpu").model).eval()
    serve_load("64-token answers, an untrained model of the cpu profile's size", untrained,
               tokenizer, questions, 64, reps)


def serve_load(name: str, model: torch.nn.Module, tokenizer, questions: list, max_tokens: int,
               reps: int) -> None:
    import asyncio

    import httpx

    from minimind_lib.inference.serve.app import create_app
    from minimind_lib.inference.serve.launch import BackgroundServer

    bodies = [{"messages": q, "max_tokens": max_tokens, "temperature": 0} for q in questions]

    async def ask(client: httpx.AsyncClient, body: dict) -> tuple[str, int]:
        r = await client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        reply = r.json()
        return reply["choices"][0]["message"]["content"], reply["usage"]["completion_tokens"]

    async def together(url: str) -> list[tuple[str, int]]:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            return list(await asyncio.gather(*(ask(client, b) for b in bodies)))

    async def in_turn(url: str) -> list[tuple[str, int]]:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            return [await ask(client, b) for b in bodies]

    global clock
    saved, clock = clock, time.perf_counter
    try:
        with BackgroundServer(create_app(model, tokenizer)) as server:
            asyncio.run(together(server.url))  # warm-up
            times, results = alternate({
                "sequential": lambda: asyncio.run(in_turn(server.url)),
                "concurrent": lambda: asyncio.run(together(server.url)),
            }, reps)
    finally:
        clock = saved
    same = results["sequential"] == results["concurrent"]
    tokens = sum(n for _, n in results["concurrent"])
    print(f"   {name} ({tokens} tokens in all):")
    print(f"     one after another {times['sequential']:6.2f} s   all at once "
          f"{times['concurrent']:6.2f} s   {times['sequential'] / times['concurrent']:.2f}x "
          f"sooner (goal >= 3x)   same answers: {same}")


# --- 4. torch.compile --------------------------------------------------------------------------


def bench_compile(reps: int, minimind_dir: str | None = None) -> None:
    """``--set train.compile=true`` and ``serve --compile`` against eager, the cpu profile."""
    import copy

    from minimind_lib.model.generation import compile_decoder, generate_many

    torch.manual_seed(0)
    config = get_profile("cpu").model
    eager = MiniMindForCausalLM(config)
    compiled = copy.deepcopy(eager)
    ids = torch.randint(0, config.vocab_size, (4, 256))
    steps = {name: train_step_fn(m, ids) for name, m in (("eager", eager),
                                                         ("compiled", torch.compile(compiled)))}
    start = time.perf_counter()
    steps["compiled"]()
    first = time.perf_counter() - start
    steps["eager"]()
    times, _ = alternate(steps, reps)
    print(f"4. torch.compile on this CPU, the cpu profile ({clock.__name__}, median of {reps}):")
    print(f"   train step 4x256: eager {times['eager'] * 1e3:.0f} ms, compiled "
          f"{times['compiled'] * 1e3:.0f} ms: {times['eager'] / times['compiled']:.2f}x "
          f"(compiling took {first:.0f} s of wall time)")
    eager.eval()
    decoder = compile_decoder(copy.deepcopy(eager))
    prompts = [list(range(5, 21))] * 1
    start = time.perf_counter()
    generate_many(decoder, prompts, 16)
    first = time.perf_counter() - start
    times, outs = alternate({"eager": lambda: generate_many(eager, prompts, 128),
                             "compiled": lambda: generate_many(decoder, prompts, 128)}, reps)
    print(f"   decode batch 1, 128 tokens: eager {128 / times['eager']:.0f} tok/s, compiled "
          f"{128 / times['compiled']:.0f} tok/s: {times['eager'] / times['compiled']:.2f}x "
          f"(compiling took {first:.0f} s)   same tokens: {outs['eager'] == outs['compiled']}")


# --- 5. training memory and speed (benchmarks/peers_train.py) --------------------------------


def bench_train(reps: int, minimind_dir: str | None = None) -> None:
    from peers_train import train_section

    print("5. training step, MiniMind2-Small:")
    train_section(reps, minimind_dir)


SECTIONS = {"eval": bench_eval, "decode": bench_decode, "server": bench_server,
            "compile": bench_compile, "train": bench_train}


def main() -> None:
    global clock
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=CLOCKS, default="cpu")
    parser.add_argument("--minimind", default=None, metavar="DIR",
                        help="a checkout of jingyaogong/minimind: its model code is measured too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores")
    for name in args.sections.split(","):
        print(f"[{load()}]")
        SECTIONS[name](args.reps, args.minimind)
    print(f"[{load()}]")


if __name__ == "__main__":
    main()
