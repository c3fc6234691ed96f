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

Usage: ``python benchmarks/peers.py [--sections eval,...] [--reps N] [--threads T]``; the load
average is printed before and after each section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from minimind_lib import DATA_DIR  # noqa: E402
from minimind_lib.evaluation.questions import (  # noqa: E402
    Answer,
    answer_budget,
    generate_answers,
    load_eval_records,
    prompt_messages,
    select_per_task,
)
from minimind_lib.model.checkpoint import load_model  # noqa: E402
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


def bench_eval(reps: int) -> None:
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


SECTIONS = {"eval": bench_eval}


def main() -> None:
    global clock
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=CLOCKS, default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores")
    for name in args.sections.split(","):
        print(f"[{load()}]")
        SECTIONS[name](args.reps)
    print(f"[{load()}]")


if __name__ == "__main__":
    main()
