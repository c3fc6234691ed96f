"""Loss by position: which positions of a served prompt the model was trained on (issue 48).

Served with the course's five tools, a prompt is about 1,070 tokens before the user's question;
the cpu profile pretrains on 256-token windows and fine-tunes on sequences of at most 768. This
script measures, for a model folder (default: the shipped reference):

1. ``text``: the next-token loss of held-out pretraining text (``data/eval/pretrain_eval.jsonl``,
   documents joined into windows of ``--length`` tokens), averaged per bucket of positions;
2. ``call``: the loss of the assistant's tool call (its tokens only: ``<tool_call>`` ...
   ``</tool_call><|im_end|>``) for held-out tool questions, rendered as the server renders them,
   once with the record's own tools (one or two, as in training) and once with all five: the
   same tokens, later positions.

Usage: ``python benchmarks/loss_by_position.py [--model DIR] [--length 1280] [--questions 100]``
(about a minute on 2 cores). Nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from minimind_lib.data.readers import read_jsonl  # noqa: E402
from minimind_lib.evaluation.questions import eval_files  # noqa: E402
from minimind_lib.evaluation.tool_use import load_tool_questions  # noqa: E402
from minimind_lib.inference.loading import find_tokenizer, load_model  # noqa: E402
from minimind_lib.tokenizer.chat import encode_chat  # noqa: E402
from minimind_lib.tokenizer.chat3 import normalise_messages  # noqa: E402
from minimind_lib.tools import tool_schemas  # noqa: E402

BUCKETS = (0, 128, 256, 384, 512, 768, 1024, 1280)


def token_losses(model, ids: list[int]) -> torch.Tensor:
    """(T-1,) the loss of each token given the ones before it."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0, :-1].float()  # (T-1, V)
    return F.cross_entropy(logits, x[0, 1:], reduction="none")


def bucket_of(position: int) -> str:
    for lo, hi in zip(BUCKETS, BUCKETS[1:], strict=False):
        if lo <= position < hi:
            return f"{lo}-{hi - 1}"
    return f"{BUCKETS[-1]}+"


def text_by_position(model, tok, length: int, windows: int) -> dict[str, float]:
    ids: list[int] = []
    for record in read_jsonl(eval_files("pretrain")[0], "pretrain"):
        ids += tok.encode(record["text"], set()) + [tok.token_to_id("<|endoftext|>")]
        if len(ids) >= length * windows:
            break
    sums: dict[str, list[float]] = {}
    for w in range(min(windows, len(ids) // length)):
        losses = token_losses(model, ids[w * length:(w + 1) * length])
        for position, loss in enumerate(losses.tolist(), start=1):
            sums.setdefault(bucket_of(position), []).append(loss)
    return {b: sum(v) / len(v) for b, v in sums.items()}


def call_losses(model, tok, questions: int, filler: str) -> list[tuple[float, ...]]:
    """Per question: (position, mean loss of the call) with its own tools; with its own tools
    after ``filler`` as the system prompt (late positions, the same tools); with all five."""
    rows = []
    records = [r for r in load_tool_questions() if r.get("call")][:questions]
    five = tool_schemas()
    for record in records:
        messages, tools = normalise_messages(record["conversations"])
        messages = [m for m in messages if m["role"] != "system"]
        user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        prompt_turns, call_turn = messages[:user + 1], messages[user + 1]
        late = len(encode_chat(tok, prompt_turns, True, tools=five)) - len(
            encode_chat(tok, prompt_turns, True, tools=tools))
        padded = [{"role": "system", "content": tok.decode(tok.encode(filler, set())[:late])},
                  *prompt_turns]
        out = []
        for turns, offered in ((prompt_turns, tools), (padded, tools), (prompt_turns, five)):
            prompt_turns_now = turns
            prompt = encode_chat(tok, prompt_turns_now, True, tools=offered)
            full = encode_chat(tok, [*prompt_turns_now, call_turn], False, tools=offered)
            full = full[:full.index(tok.token_to_id("<|im_end|>"), len(prompt)) + 1]
            losses = token_losses(model, full)[len(prompt) - 1:]  # the call's tokens
            out += [len(prompt), float(losses.mean())]
        rows.append(tuple(out))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="data/reference/sft")
    parser.add_argument("--length", type=int, default=1280)
    parser.add_argument("--windows", type=int, default=24)
    parser.add_argument("--questions", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(args.model).float().eval(), find_tokenizer(args.model)
    print(f"model {args.model}: context {model.config.max_position_embeddings}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters\n")
    text = text_by_position(model, tok, args.length, args.windows)
    print("held-out text, next-token loss by position\n\n| positions | loss |\n|---|---:|")
    for b, v in text.items():
        print(f"| {b} | {v:.3f} |")
    filler = " ".join(r["text"] for r in read_jsonl(eval_files("pretrain")[0], "pretrain"))
    rows = call_losses(model, tok, args.questions, filler)
    n = len(rows)
    means = [sum(r[k] for r in rows) / n for k in range(6)]
    print(f"\n{n} held-out tool calls: the loss of the call's tokens (mean over questions)\n")
    print("| prompt | the call starts at position (mean) | loss of the call |")
    print("|---|---:|---:|")
    labels = ["the record's own tools (as in training)",
              "the same tools after held-out text as the system prompt (late positions)",
              "all five tools (as a client sends them)"]
    for k, label in enumerate(labels):
        print(f"| {label} | {means[2 * k]:.0f} | {means[2 * k + 1]:.3f} |")


if __name__ == "__main__":
    main()
