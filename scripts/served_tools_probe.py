"""Does a tool phase that shows the model its tools as they are served fix the served calls?
(issue 48; an experiment, not a stage: docs/benchmarks.md has its figures.)

Continue a chat model (default: the shipped reference) for ``--steps`` SFT steps on new tool
conversations that offer 1 to all 5 tools in random order (the needed one among them), beside
the bundled general SFT data so text skills are rehearsed, at a sequence length that holds the
five-tool prompt (``--seq-len``, default 1,280). The questions are drawn fresh: none is a
held-out question, and poem titles come from the training split only. Then measure, before and
after, on held-out tool questions rendered as the server renders them (the user's question, all
five tools): calls that parse and validate, the right tool, the right call (tool and
arguments), free and under the tools' grammar; the held-out table with each record's own tools
(``evaluate_tools``); held-out text perplexity.

    python scripts/served_tools_probe.py [--model data/reference/sft] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import build_tool_data as btd  # noqa: E402
import torch  # noqa: E402

from minimind_lib import DATA_DIR  # noqa: E402
from minimind_lib.course.profiles import get_profile  # noqa: E402
from minimind_lib.data.readers import read_jsonl  # noqa: E402
from minimind_lib.evaluation.perplexity import perplexity  # noqa: E402
from minimind_lib.evaluation.questions import eval_files  # noqa: E402
from minimind_lib.evaluation.tool_use import (  # noqa: E402
    evaluate_tools,
    load_tool_questions,
    same_arguments,
    tool_table,
)
from minimind_lib.inference.loading import find_tokenizer, load_model  # noqa: E402
from minimind_lib.inference.structured import constrain_tool_calls, validate  # noqa: E402
from minimind_lib.model.generation import generate_many  # noqa: E402
from minimind_lib.tokenizer.chat import encode_chat  # noqa: E402
from minimind_lib.tools import parse_tool_calls, tool_schemas  # noqa: E402

FIVE = tool_schemas()
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in FIVE}


def offered_1_to_5(name: str | None, rng: random.Random) -> list[dict]:
    """The needed tool (a random one when none is needed) and 0-4 others, in random order;
    half the records offer all five, as a client does."""
    first = name or rng.choice(btd.TOOL_KINDS)
    others = [t for t in btd.TOOL_KINDS if t != first]
    k = 4 if rng.random() < 0.5 else rng.randint(0, 3)
    names = [first, *rng.sample(others, k)]
    rng.shuffle(names)
    return tool_schemas(names)


def tool_phase_records(per_kind: int, no_tool: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    held = load_tool_questions()
    taken = {next(m["content"] for m in r["conversations"] if m["role"] == "user") for r in held}
    train = [json.loads(line) for line in (DATA_DIR / btd.TRAIN_FILE).open(encoding="utf-8")]
    titles = sorted({json.loads(r["conversations"][2]["tool_calls"])[0]["arguments"]["title"]
                     for r in train if r["tool_task"] == "poem_author"})
    makers = {"calculate": btd._calculate, "convert_units": btd._convert,
              "days_between": btd._days, "weekday": btd._weekday, "poem_author": btd._poem(titles)}
    btd._offered = offered_1_to_5  # every record the generator writes offers 1-5 tools
    records = [btd.tool_record(kind, q, rng) for kind in btd.TOOL_KINDS
               for q in btd._unique(makers[kind], per_kind, rng, taken)]
    sft = [r for r in read_jsonl(DATA_DIR / "sft_sample.jsonl", "sft") if r.get("task")]
    records += [btd.no_tool_record(r, rng) for r in rng.sample(sft, no_tool)]
    records += [r for r in train if r["tool_task"] in ("multi_step", "without_tools")]
    rng.shuffle(records)
    return records


def served_scores(model, tok, records: list[dict]) -> dict[str, dict[str, float]]:
    """Greedy, the user's question alone with all five tools (the server's rendering)."""
    questions = [next(m["content"] for m in r["conversations"] if m["role"] == "user")
                 for r in records]
    prompts = [encode_chat(tok, [{"role": "user", "content": q}], True, tools=FIVE)
               for q in questions]
    stop = [tok.token_to_id("<|im_end|>")]
    out = {}
    for arm, grammar in (("free", None), ("grammar", constrain_tool_calls(FIVE, tok))):
        replies = generate_many(model, prompts, 96, eos_token_id=stop, constraints=grammar)
        valid = right = exact = 0
        for record, tokens in zip(records, replies, strict=True):
            reply = parse_tool_calls(tok.decode([t for t in tokens if t not in stop]))
            ok = bool(reply.calls) and not reply.errors and all(
                c["name"] in PARAMETERS and not validate(c["arguments"], PARAMETERS[c["name"]])
                for c in reply.calls)
            first = reply.calls[0] if ok else None
            valid += ok
            right += bool(first) and first["name"] == record["call"]["name"]
            exact += bool(first) and first["name"] == record["call"]["name"] and same_arguments(
                first["arguments"], record["call"]["arguments"])
        n = len(records)
        out[arm] = {"parse and validate": valid / n, "right tool": right / n,
                    "right call": exact / n}
    return out


def measure(model, tok, held: list[dict], per_task: int) -> dict:
    model.eval()
    text = perplexity(model, tok, eval_files("pretrain")[0], 256, progress=False)
    return {"served": served_scores(model, tok, held), "perplexity": text,
            "table": evaluate_tools(model, tok, per_task, progress=False)}


def report(name: str, m: dict) -> None:
    print(f"\n### {name}\n\nheld-out text perplexity {m['perplexity']:.1f}\n")
    print("| served, five tools | parse and validate | right tool | right call |")
    print("|---|---:|---:|---:|")
    for arm, s in m["served"].items():
        print(f"| {arm} | {s['parse and validate']:.1%} | {s['right tool']:.1%} | "
              f"{s['right call']:.1%} |")
    print(f"\n{tool_table(m['table'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DATA_DIR / "reference" / "sft"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seq-len", type=int, default=1280)
    parser.add_argument("--per-kind", type=int, default=400)
    parser.add_argument("--per-task", type=int, default=20, help="held-out questions per kind")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--replay", type=float, default=0.0,
                        help="share of the supervised tokens replayed as pretraining text "
                             "(64-token windows, as the cpu profile's SFT)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model).float(), find_tokenizer(args.model)
    held = [r for r in load_tool_questions(args.per_task) if r.get("call")]
    before = measure(model, tok, held, args.per_task)
    report(f"before: {args.model}", before)
    profile = get_profile("cpu")
    settings = replace(profile.sft, max_steps=args.steps, replay=args.replay, replay_window=64,
                       warmup_steps=10, learning_rate=args.lr, seq_len=args.seq_len,
                       eval_every=args.steps, save_every=args.steps, max_examples=None)
    records = tool_phase_records(args.per_kind, 300, seed=btd.SEED + 48)
    with tempfile.TemporaryDirectory() as tmp:
        tools_file = Path(tmp) / "tool_phase.jsonl"
        tools_file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                              encoding="utf-8")
        start = time.perf_counter()
        from minimind_lib.training.sft import train_sft

        replayed = None
        if args.replay:
            from minimind_lib.course.stage_data import replay_text

            replayed = replay_text(profile, Path(args.model) / "tokenizer.json",
                                   Path(tmp) / "replay_data", 64, progress=False)
        train_sft(model, tok, settings, seed=0, out_dir=Path(tmp) / "run", progress=False,
                  files=[tools_file, DATA_DIR / "sft_sample.jsonl"], replay_text=replayed)
        print(f"\n{args.steps} steps (seq_len {args.seq_len}, lr {args.lr:g}, replay "
              f"{args.replay:g}) on "
              f"{len(records):,} tool-phase records + the bundled SFT sample: "
              f"{time.perf_counter() - start:.0f} s")
    report(f"after {args.steps} steps", measure(model, tok, held, args.per_task))


if __name__ == "__main__":
    main()
