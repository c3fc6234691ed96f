#!/usr/bin/env python
"""Does a small model learn the bundled SFT tasks?  Exact match before/after a short SFT run.

    python scripts/check_sft_learnability.py --hidden 64 --layers 2 --steps 80
    python scripts/check_sft_learnability.py --hidden 256 --layers 4 --steps 600

Trains from random initialisation (no pretraining: the hardest case) on
data/sft_sample.jsonl with answer-only labels (assistant content + <|im_end|>), then
decodes greedily on held-out prompts of data/eval/sft_eval.jsonl and prints, per task,
exact match, character F1 and the answer tokens' loss before and after.  A measurement tool for
data/README.md and the course's profile choices; it is not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter

import torch

from minimind_lib import DATA_DIR
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.tokenizer import encode_chat, load_tokenizer


def example(tok, prompt: str, answer: str, max_len: int) -> tuple[list[int], list[int]]:
    """(ids, labels): labels -100 except on the answer tokens and the closing <|im_end|>."""
    user = [{"role": "user", "content": prompt}]
    head = encode_chat(tok, user, add_generation_prompt=True)
    full = encode_chat(tok, user + [{"role": "assistant", "content": answer}])
    assert full[:len(head)] == head
    end = len(head) + len(tok.encode(answer, allowed_special=set())) + 1  # + <|im_end|>
    labels = [-100] * len(head) + full[len(head):end] + [-100] * (len(full) - end)
    return full[:max_len], labels[:max_len]


def char_f1(pred: str, ref: str) -> float:
    common = sum((Counter(pred) & Counter(ref)).values())
    if not common:
        return 0.0
    p, r = common / len(pred), common / len(ref)
    return 2 * p * r / (p + r)


def batches(data: list[tuple[list[int], list[int]]], size: int):
    """Right-padded (ids, labels) tensors, ``size`` examples at a time."""
    for i in range(0, len(data), size):
        chunk = data[i:i + size]
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.tensor([x + [0] * (width - len(x)) for x, _ in chunk])  # (B, T)
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in chunk])  # (B, T)
        yield ids, labels


@torch.no_grad()
def answer_loss(model, tok, rows: list[dict]) -> dict[str, float]:
    """Mean cross-entropy per supervised (answer) token on ``rows``, per task."""
    model.eval()
    out = {}
    for task in sorted({r["task"] for r in rows}):
        data = [example(tok, r["conversations"][0]["content"], r["answer"], 128)
                for r in rows if r["task"] == task]
        total = n = 0.0
        for ids, labels in batches(data, 32):
            k = int((labels[:, 1:] != -100).sum())
            total += model(ids, labels=labels).loss.item() * k
            n += k
        out[task] = total / n
    model.train()
    return out


@torch.no_grad()
def evaluate(model, tok, rows: list[dict], show: int = 0) -> dict[str, tuple[float, float]]:
    model.eval()
    end_id = tok.token_to_id("<|im_end|>")
    hits: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        prompt = r["conversations"][0]["content"]
        ids = torch.tensor([encode_chat(tok, [{"role": "user", "content": prompt}],
                                        add_generation_prompt=True)])
        out = model.generate(ids, max_new_tokens=32, temperature=0,
                             eos_token_id=end_id)[0, ids.shape[1]:].tolist()
        if end_id in out:
            out = out[:out.index(end_id)]
        pred = tok.decode(out).strip()
        hits.setdefault(r["task"], []).append((float(pred == r["answer"]),
                                               char_f1(pred, r["answer"])))
        if len(hits[r["task"]]) <= show:
            print(f"  {r['task']}: {prompt!r} -> {pred!r} (reference {r['answer']!r})")
    model.train()
    return {t: (sum(h[0] for h in v) / len(v), sum(h[1] for h in v) / len(v))
            for t, v in sorted(hits.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--per-task", type=int, default=40, help="eval prompts per task")
    ap.add_argument("--family", default="skill", choices=["skill", "knowledge", "all"])
    ap.add_argument("--show", type=int, default=0, help="print this many predictions per task")
    args = ap.parse_args()

    torch.manual_seed(0)
    tok = load_tokenizer()
    train = [json.loads(x) for x in (DATA_DIR / "sft_sample.jsonl").open(encoding="utf-8")]
    evals = [json.loads(x) for x in (DATA_DIR / "eval/sft_eval.jsonl").open(encoding="utf-8")]
    keep = (lambda r: True) if args.family == "all" else (lambda r: r["family"] == args.family)
    train = [r for r in train if keep(r)]
    per_task: Counter[str] = Counter()
    evals = [r for r in evals if keep(r) and (per_task.update([r["task"]])
                                              or per_task[r["task"]] <= args.per_task)]
    data = [example(tok, r["conversations"][0]["content"], r["conversations"][1]["content"], 128)
            for r in train]

    heads = max(2, args.hidden // 64)
    cfg = MiniMindConfig(vocab_size=len(tok), hidden_size=args.hidden,
                         num_hidden_layers=args.layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                         max_position_embeddings=256)
    model = MiniMindForCausalLM(cfg)
    print(f"model: {model.num_parameters():,} params; {len(data):,} SFT examples; "
          f"{len(evals)} eval prompts")
    before, loss_before = evaluate(model, tok, evals), answer_loss(model, tok, evals)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rng = random.Random(0)
    t0 = time.time()
    for step in range(args.steps):
        ids, labels = next(batches([data[rng.randrange(len(data))] for _ in range(args.batch)],
                                   args.batch))
        lr = args.lr * min(1.0, (step + 1) / 10)  # short warmup
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {loss.item():.3f}")
    print(f"trained {args.steps} steps in {time.time() - t0:.0f} s")
    after, loss_after = evaluate(model, tok, evals, show=args.show), answer_loss(model, tok, evals)
    print(f"{'task':22s} {'EM before':>9s} {'EM after':>9s} {'F1 before':>9s} {'F1 after':>9s}"
          f" {'loss before':>11s} {'loss after':>10s}")
    for t in after:
        print(f"{t:22s} {before[t][0]:9.2f} {after[t][0]:9.2f} {before[t][1]:9.2f} "
              f"{after[t][1]:9.2f} {loss_before[t]:11.2f} {loss_after[t]:10.2f}")


if __name__ == "__main__":
    main()
