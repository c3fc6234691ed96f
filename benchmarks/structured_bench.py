"""Structured outputs (notebook 18, issue 47), measured on the shipped reference model.

1. ``index``: the time to build each grammar's token index (ours, pure Python) beside
   outlines-core's (Rust) on the same regex and vocabulary, and the automaton's size.
2. ``overhead``: what the mask costs a decoding step: batch-1 (and batch-8) greedy decode at the
   cpu profile's size, the same number of tokens free and under a grammar, in alternating
   rounds; the ratio is the mask's share of a step.
3. ``served``: the held-out tool questions through the server and the official ``openai``
   client with the course's five tools, as a client sends them: free (``tool_choice`` auto, no
   grammar) against ``tool_choice="required"`` (the grammar): parsable calls, the right tool,
   valid arguments; plain and streamed, and all at once (one batch).
4. ``schemas``: random schemas from the supported subset ("hidden": none is in the tests),
   each decoded by the reference model at temperature 1, batch 1 and batched: the share that
   parses and validates.
5. ``table``: the held-out tool table, free and under the tools' grammar (``evaluate_tools``
   with ``constrain``).

Usage: ``python benchmarks/structured_bench.py [--sections index,overhead,...] [--threads 1]``
(about 8 minutes on 2 cores). Nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from minimind_lib.evaluation.tool_use import evaluate_tools, load_tool_questions, tool_table  # noqa: E402,E501
from minimind_lib.inference.loading import find_tokenizer, load_model  # noqa: E402
from minimind_lib.inference.structured import (  # noqa: E402
    TokenIndex,
    TokenVocabulary,
    call_schema,
    compile_regex,
    constrain,
    constrain_tool_calls,
    schema_to_regex,
    tool_grammar,
    validate,
    vocabulary,
)
from minimind_lib.model.generation import generate_many  # noqa: E402
from minimind_lib.tokenizer.chat import encode_chat  # noqa: E402
from minimind_lib.tools import tool_schemas  # noqa: E402

REFERENCE = "data/reference/sft"
TOOLS = tool_schemas()
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def section_index(tok) -> None:
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    vocab = vocabulary(tok)
    stop = tok.token_to_id("<|im_end|>")
    theirs_vocab = outlines_core.Vocabulary(stop, vocab.by_bytes())
    ours_vocab = TokenVocabulary(vocab.token_bytes, vocab.special, {stop})
    print("| grammar | states | ours: automaton + index (s) | outlines-core (s) |")
    print("|---|---:|---:|---:|")
    cases = {f"{name} arguments": p for name, p in PARAMETERS.items()}
    cases["one call of the five tools"] = call_schema(TOOLS)
    cases["json_object"] = {"type": "object"}
    for name, schema in cases.items():
        t0 = time.perf_counter()
        index = TokenIndex(compile_regex(schema_to_regex(schema)), ours_vocab)
        t1 = time.perf_counter()
        outlines_core.Index(build_regex_from_schema(json.dumps(schema), None), theirs_vocab)
        t2 = time.perf_counter()
        print(f"| {name} | {index.num_states:,} | {t1 - t0:.3f} | {t2 - t1:.3f} |")
    for label, kw in (("tool_choice required (five tools, markers)", {"required": True}),
                      ("strict tools under auto", {"required": False})):
        t0 = time.perf_counter()
        c = constrain_tool_calls(TOOLS, tok, **kw)
        print(f"| {label} | {c.num_states:,} | {time.perf_counter() - t0:.3f} | - |")


def _timed(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def section_overhead(model, tok, reps: int) -> None:
    """Greedy decode of the same number of tokens, free and constrained, alternating."""
    prompts = [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("Give me a person as JSON.", "What is 37 * 48?", "Hello!",
                         "Convert 12 miles to km.", "Who wrote 静夜思?", "Name a colour.",
                         "What day is it?", "Count to five.")]
    person = {"type": "object", "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                             "city": {"type": "string"}}}
    grammar = constrain(person, tok)
    budget = 96
    print("| batch | free ms/token | constrained ms/token | mask overhead (median of paired "
          "rounds) | lowest, highest round |")
    print("|---:|---:|---:|---:|---:|")
    for batch in (1, 8):
        rows = prompts[:batch]
        free_t, con_t = [], []
        n_tokens = len(rows) * budget
        for _ in range(reps):  # no stop id: every row writes exactly ``budget`` tokens
            con_t.append(_timed(lambda r=rows: generate_many(model, r, budget,
                                                             constraints=grammar)))
            free_t.append(_timed(lambda r=rows: generate_many(model, r, budget)))
        free, con = statistics.median(free_t), statistics.median(con_t)
        ratios = sorted(c / f - 1 for c, f in zip(con_t, free_t, strict=True))
        print(f"| {batch} | {1e3 * free / n_tokens:.2f} | {1e3 * con / n_tokens:.2f} | "
              f"{statistics.median(ratios):+.1%} | {ratios[0]:+.1%}, {ratios[-1]:+.1%} |")


def _served_questions() -> list[dict]:
    return [r for r in load_tool_questions() if r["tool_task"] not in ("no_tool", "multi_step")]


def section_served(model, tok, limit: int | None) -> None:
    import openai

    from minimind_lib.inference.serve.app import create_app
    from minimind_lib.inference.serve.launch import BackgroundServer

    records = _served_questions()[:limit]
    questions = [next(m["content"] for m in r["conversations"] if m["role"] == "user")
                 for r in records]
    with BackgroundServer(create_app(model, tok, model_name="reference")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

        def ask(question: str, stream: bool, **kw) -> list[tuple[str, str]]:
            args = dict(model="reference", messages=[{"role": "user", "content": question}],
                        tools=TOOLS, max_tokens=120, temperature=0, **kw)
            if not stream:
                msg = client.chat.completions.create(**args).choices[0].message
                return [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
            calls: dict[int, list[str]] = {}
            for chunk in client.chat.completions.create(stream=True, **args):
                for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    calls.setdefault(c.index, [c.function.name, ""])[1] += c.function.arguments
            return [tuple(c) for c in calls.values()]

        prompt = encode_chat(tok, [{"role": "user", "content": questions[0]}], True, tools=TOOLS)
        print(f"{len(records)} held-out tool questions, five tools offered ({len(prompt)} "
              "prompt tokens)\n")
        print("| decoding | calls parse and validate | right tool | right tool and arguments |")
        print("|---|---:|---:|---:|")
        arms = {"free (auto)": dict(stream=False),
                "tool_choice required": dict(stream=False, tool_choice="required"),
                "tool_choice required, streamed": dict(stream=True, tool_choice="required")}
        for label, kw in arms.items():
            results = [ask(q, **kw) for q in questions]
            _served_row(label, records, results)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda q: ask(q, False, tool_choice="required"), questions))
        _served_row(f"tool_choice required, 16 at once ({time.perf_counter() - t0:.0f} s)",
                    records, results)


def _served_row(label: str, records: list[dict], results: list[list[tuple[str, str]]]) -> None:
    from minimind_lib.evaluation.tool_use import same_arguments

    valid = right = exact = 0
    for record, calls in zip(records, results, strict=True):
        try:
            parsed = [(n, json.loads(a)) for n, a in calls]
        except json.JSONDecodeError:
            parsed = None
        ok = bool(parsed) and all(n in PARAMETERS and not validate(a, PARAMETERS[n])
                                  for n, a in parsed)
        valid += ok
        if ok and parsed[0][0] == record["call"]["name"]:
            right += 1
            exact += same_arguments(parsed[0][1], record["call"]["arguments"])
    n = len(records)
    print(f"| {label} | {valid / n:.1%} | {right / n:.1%} | {exact / n:.1%} |")


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A schema from the supported subset (strings and arrays bounded or not)."""
    kinds = ["string", "integer", "number", "boolean", "enum", "null"]
    if depth < 2:
        kinds += ["object", "object", "array", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "enum":
        return {"enum": rng.sample(["a", "b c", "是", 1, 2.5, True, None], rng.randint(1, 4))}
    if kind == "object":
        names = rng.sample(["id", "name", "城市", "tags", "ok", "n", "x_y"], rng.randint(1, 4))
        props = {n: random_schema(rng, depth + 1) for n in names}
        return {"type": "object", "properties": props,
                "required": [n for n in names if rng.random() < 0.6],
                "additionalProperties": False}
    if kind == "array":
        schema = {"type": "array", "items": random_schema(rng, depth + 1)}
        if rng.random() < 0.7:
            schema["maxItems"] = rng.randint(1, 3)
        return schema
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(2)]}
    schema = {"type": kind}
    if kind == "string" and rng.random() < 0.5:
        schema["maxLength"] = rng.randint(1, 12)
    return schema


def section_schemas(model, tok, n: int) -> None:
    rng = random.Random(47)
    prompt = encode_chat(tok, [{"role": "user", "content": "Answer in JSON."}], True)
    stats = {"batch 1": [0, 0, 0], "batch 8": [0, 0, 0]}  # outputs, parse+valid, stopped
    budget = 96
    for k in range(n):
        schema = random_schema(rng)
        grammar = constrain(schema, tok)
        if grammar.index.min_tokens > budget:
            continue
        g = torch.Generator().manual_seed(k)
        runs = {"batch 1": [generate_many(model, [prompt], budget, temperature=1.0, generator=g,
                                          eos_token_id=[2], constraints=grammar)[0]],
                "batch 8": generate_many(model, [prompt] * 8, budget, temperature=1.0,
                                         generator=g, eos_token_id=[2], constraints=grammar)}
        for arm, outs in runs.items():
            for tokens in outs:
                stats[arm][0] += 1
                stats[arm][2] += tokens[-1] == 2
                try:
                    value = json.loads(tok.decode([t for t in tokens if t != 2]))
                    stats[arm][1] += not validate(value, schema)
                except json.JSONDecodeError:
                    pass
    print(f"{n} random schemas, temperature 1, at most {budget} tokens\n")
    print("| arm | outputs | parse and validate | stopped by the model |")
    print("|---|---:|---:|---:|")
    for arm, (total, good, stopped) in stats.items():
        print(f"| {arm} | {total} | {good / total:.1%} | {stopped / total:.1%} |")


def section_table(model, tok, per_task: int) -> None:
    t0 = time.perf_counter()
    scores = evaluate_tools(model, tok, per_task, progress=False, constrain=tool_grammar(tok))
    print(f"per task: {per_task} ({time.perf_counter() - t0:.0f} s)\n")
    print(tool_table(scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", default="index,overhead,served,schemas,table")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--served", type=int, default=None, help="questions (default: all)")
    parser.add_argument("--schemas", type=int, default=40)
    parser.add_argument("--per-task", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(REFERENCE).eval(), find_tokenizer(REFERENCE)
    print(f"torch {torch.__version__}, {args.threads} thread(s), model {REFERENCE} "
          f"({sum(p.numel() for p in model.parameters()):,} parameters)")
    for name in args.sections.split(","):
        print(f"\n## {name}\n")
        t0 = time.perf_counter()
        if name == "index":
            section_index(tok)
        elif name == "overhead":
            section_overhead(model, tok, args.reps)
        elif name == "served":
            section_served(model, tok, args.served)
        elif name == "schemas":
            section_schemas(model, tok, args.schemas)
        elif name == "table":
            section_table(model, tok, args.per_task)
        else:
            raise SystemExit(f"unknown section {name!r}")
        print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
