"""Cells of notebook 17 (benchmarks) and its solutions: ``python scripts/nb17.py`` writes
notebooks/17_benchmarks.ipynb and notebooks/solutions/17_benchmarks.ipynb (cell ids are
derived from the cell's position and kind, so a rebuild keeps them)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MD, CODE = "markdown", "code"

CELLS = [
(MD, r"""# 17 · Benchmarks: how a language model takes a multiple-choice test

**Goals.** MiniMind reports C-Eval, CMMLU, ARC-Easy, PIQA, OpenBookQA, HellaSwag and Social-IQa
for its models, all through EleutherAI's lm-evaluation-harness, and all **multiple choice**.
A language model does not tick a box: it gives every choice a probability as the text that
follows the question, and the best one counts as its answer. By the end you will have built,
and checked against the library:

1. the **context / continuation split** lm-eval uses, and each choice's **log-likelihood**
   by hand, equal to `choice_logprobs`;
2. **acc** (the highest log-likelihood), **acc_norm** (per character of the choice) and the
   **chance** level, on the course's own held-out questions turned into 4-way multiple choice;
3. why a small model sits near chance on C-Eval while it answers the course's skill
   questions, and what the prompt format (plain text or the chat template) changes;
4. the course's model **inside lm-evaluation-harness** (`lm_eval` itself, on a local task
   written here), giving exactly the course's figures, and **bits per byte**, the one
   text score that compares models with different tokenizers;
5. how MiniMind's published numbers were made, and the one command that puts your model on
   the same scale.

The model is the shipped chat model (`data/reference/sft`, the cpu profile's SFT, 4.5M
parameters) in every profile, so every figure below is the same in smoke, cpu and gpu.

**Library twins:** `minimind_lib.evaluation.multiple_choice` (`encode_pair`,
`continuation_logprobs`, `choice_logprobs`, `mc_metrics`, `held_out_items`, `held_out_mc`),
`minimind_lib.inference.harness` (the `minimind` model of lm-eval, `bench`),
`minimind_lib.evaluation.perplexity` (`bits_per_byte`, `text_logprobs`), and
`python -m minimind_lib bench`. Exercises: 17.1 (the split), 17.2 (the two picks); answers in
`solutions/17_benchmarks.ipynb`."""),
(CODE, r"""# NBVAL_IGNORE_OUTPUT
import importlib.util
import json
import math
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from minimind_lib.core.device import seed_everything
from minimind_lib.course.exercises import exercise
from minimind_lib.course.pipeline import REFERENCE_MODEL
from minimind_lib.course.profiles import get_profile
from minimind_lib.course.quoted import check_quoted
from minimind_lib.evaluation.multiple_choice import (MCItem, choice_logprobs, encode_pair, held_out_items,
                                                     held_out_mc, mc_metrics)
from minimind_lib.evaluation.perplexity import bits_per_byte, perplexity, text_logprobs
from minimind_lib.evaluation.questions import eval_files, load_eval_records, select_per_task
from minimind_lib.inference.loading import load_for_serving
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM

profile = get_profile()                     # $MINIMIND_PROFILE: smoke / cpu / gpu / full
seed_everything(profile.seed)
torch.set_num_threads(1)                    # small batches: one thread is as fast, and shares the cores
model, tokenizer = load_for_serving(REFERENCE_MODEL, "cpu")
records = load_eval_records()               # 1,440 held-out questions: 12 tasks x 120
questions = select_per_task(records, 40)    # 40 a task in every profile: the same figures everywhere
print(f"profile {profile.name}; model {model.num_parameters() / 1e6:.2f}M parameters; "
      f"{len(questions)} of {len(records)} held-out questions")"""),
(MD, r"""## 1 · A question and four answers

Take one held-out question and make it multiple choice: the reference answer and three
answers of *other* questions of the same task (a poet for a poet, a sum for a sum), so every
choice looks like an answer and only knowing the right one helps (`held_out_items`, a fixed
seed per question). Written as lm-eval's tasks write a question without a chat template
(ARC's `Question: ...\nAnswer:`), the **context** is `Question: <q>\nAnswer: ` and each
**continuation** is one choice.

The model scores a continuation $c = (c_1, \dots, c_m)$ after the context $x$ by its
log-likelihood

$$\ell(c) = \sum_{t=1}^{m} \log p(c_t \mid x, c_{<t}),$$

one forward pass over `context + continuation`, reading the log-probability of each
continuation token at the position before it. One detail decides which tokens are the
continuation's: lm-eval moves the context's trailing whitespace to the front of the
continuation, encodes the **whole** text once, and takes the continuation as what follows the
context's own ids. The tokenizer learned `" Paris"` (space included) as the pieces of a word; split
the text after the space and `"Paris"` would be scored as tokens the model rarely sees."""),
(CODE, r"""item = held_out_items([r for r in records if r["task"] == "larger_number"][:1], pool=records)[0]
print(item.context + "|", item.choices, "gold:", item.gold)
ctx_ids, cont_ids = encode_pair(tokenizer, item.context, item.choices[0])
print("context ends", [tokenizer.decode([i]) for i in ctx_ids[-3:]], "| continuation",
      [tokenizer.decode([i]) for i in cont_ids])
apart = tokenizer.encode(item.context, set()) + tokenizer.encode(item.choices[0], set())
print(f"whole text {len(ctx_ids) + len(cont_ids)} tokens; the two parts encoded apart {len(apart)}")
assert ctx_ids + cont_ids == tokenizer.encode(item.context + item.choices[0], set())
assert tokenizer.decode(cont_ids).startswith(" ")          # the space went with the answer"""),
(MD, r"""Now the log-likelihoods by hand: one forward pass per choice, `log_softmax` over the
vocabulary, the continuation's tokens read at the positions before them (position $t$
predicts token $t+1$). The library does the same for many (context, choice) rows at once,
right-padded in batches, and must give the same numbers."""),
(CODE, r"""def loglik_by_hand(context, choice):
    '''Summed log p of the choice's tokens after the context: one forward pass.'''
    ctx, cont = encode_pair(tokenizer, context, choice)
    ids = torch.tensor([ctx + cont])                                  # (1, T)
    with torch.no_grad():
        logp = F.log_softmax(model(ids[:, :-1]).logits.double(), -1)  # (1, T-1, V)
    targets = ids[0, len(ctx):]                                       # (m,) the continuation
    return logp[0, len(ctx) - 1:].gather(1, targets[:, None]).sum().item()

mine = [loglik_by_hand(item.context, c) for c in item.choices]
(library,) = choice_logprobs(model, tokenizer, [item])
for c, ll, lib in zip(item.choices, mine, library):
    print(f"{c!r:12} ll {ll:8.3f}  per character {ll / len(c):7.3f}  (library {lib:8.3f})")
assert all(abs(a - b) < 1e-3 for a, b in zip(mine, library))
assert max(range(4), key=lambda k: mine[k]) == item.gold          # it knows which number is larger"""),
(MD, r"""**Exercise 17.1 · The split.** Write `split_pair(tokenizer, context, continuation)`
returning `(context ids, continuation ids)` as lm-eval splits them: move the context's
trailing whitespace (`str.rstrip()`) to the front of the continuation, encode the whole text
once (`tokenizer.encode(text)`), and return the context's own ids and what follows them. An
empty context is `[<|endoftext|> id]` with the continuation's ids. The check compares with
`encode_pair` on six pairs, Chinese and newlines included."""),
(CODE, r"""def split_pair(tokenizer, context, continuation):      # exercise 17.1: your code here
    raise NotImplementedError("exercise 17.1")"""),
(CODE, r"""exercise("17.1", split_pair);"""),
(MD, r"""## 2 · acc, acc_norm and chance

With every choice's $\ell$, lm-eval reports two accuracies:

* **acc**: the answer is $\arg\max_i \ell(c_i)$. A long choice pays for every token, so
  `acc` favours short answers;
* **acc_norm**: $\arg\max_i \ell(c_i) / |c_i|$ with $|c_i|$ the choice's length in
  **characters** (lm-eval's `completion_len = len(choice)`), which removes most of that bias;
* **chance**: $1/k$ for $k$ choices, what a coin would score; 25% here.

**Exercise 17.2 · The picks.** Write `picks(lls, choices)` returning
`(raw pick, normalised pick)`: the index of the highest log-likelihood and of the highest
log-likelihood per character, the first one on a tie (as `numpy.argmax`)."""),
(CODE, r"""def picks(lls, choices):      # exercise 17.2: your code here
    raise NotImplementedError("exercise 17.2")"""),
(CODE, r"""exercise("17.2", picks);"""),
(MD, r"""The whole set: the 480 questions (40 a task) in two formats. **plain** is the text above;
**chat** puts the question through the model's chat template (`<|im_start|>user ...
<|im_start|>assistant`, plus MiniMind-3's empty think block), which is what
`lm_eval --apply_chat_template` does and how MiniMind runs its benchmarks. `held_out_mc`
scores every choice once and reports each task, each family and all."""),
(CODE, r"""scores = {fmt: held_out_mc(model, tokenizer, questions, pool=records, fmt=fmt) for fmt in ("plain", "chat")}
tasks = [t for t in scores["plain"] if ":" not in t and t != "all"]
print(f"{'':22}{'plain acc':>10}{'acc_norm':>10}{'chat acc':>10}{'acc_norm':>10}")
for name in tasks + ["family:skill", "family:knowledge", "all"]:
    p, c = scores["plain"][name], scores["chat"][name]
    print(f"{name:22}{p.acc:10.1%}{p.acc_norm:10.1%}{c.acc:10.1%}{c.acc_norm:10.1%}")
# the library's metrics from the library's log-likelihoods, recomputed here from the picks
plain_items = held_out_items(questions, pool=records)
lls = choice_logprobs(model, tokenizer, plain_items)
acc = sum(max(range(4), key=lambda k: (ll[k], -k)) == it.gold for ll, it in zip(lls, plain_items)) / len(plain_items)
assert abs(acc - scores["plain"]["all"].acc) < 1e-12 and mc_metrics(lls, plain_items) == scores["plain"]["all"]"""),
(CODE, r"""# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(11, 3.6))
x = torch.arange(len(tasks))
for k, fmt in enumerate(("plain", "chat")):
    ax.bar(x + (k - 0.5) * 0.38, [scores[fmt][t].acc for t in tasks], width=0.38, label=f"{fmt}: acc")
ax.axhline(0.25, ls="--", color="gray", label="chance (4 choices)")
families = {r["task"]: r["family"] for r in records}
ax.set_xticks(x, [f"{t}\n({families[t]})" for t in tasks], rotation=35, ha="right", fontsize=8)
ax.set(ylabel="accuracy", ylim=(0, 1), title="the held-out questions as 4-way multiple choice (the shipped 4.5M model)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()"""),
(MD, r"""**What you should see** (every profile: the shipped model, 480 questions). The **skill**
questions score well above chance: 55-60% in the plain format and 72-78% with the chat
template (`arithmetic` and `larger_number` almost always right: the answer is written in the question;
`copy_en` and `extract_title` gain most from `acc_norm`, since their choices differ in
length). The **knowledge** questions sit near chance, 28-33% in either format (chance: one in four):
the model has seen a few thousand poems and definitions, not enough to know which poet wrote
a line. The chat template helps because it is the format SFT trained on."""),
(CODE, r"""QUOTED = {"plain skill": (0.55, 0.60), "chat skill": (0.72, 0.78), "knowledge, both formats": (0.28, 0.33)}
check_quoted(QUOTED, {"plain skill": scores["plain"]["family:skill"].acc, "chat skill": scores["chat"]["family:skill"].acc,
                      "knowledge, both formats": [scores[f]["family:knowledge"].acc for f in ("plain", "chat")]})
assert scores["chat"]["family:skill"].acc > scores["plain"]["family:skill"].acc"""),
(MD, r"""## 3 · Why small models sit at chance on C-Eval

C-Eval, CMMLU, ARC and OpenBookQA ask for **knowledge**: a fact of law, medicine or
physics, and the choices are all plausible-looking facts. The log-likelihood can only prefer
the right one if the model has read enough to know it. The course's knowledge questions show
the same thing at our scale: the model prefers *an* answer of the right form (a poet's name)
but not *the* answer. MiniMind-3 (64M parameters, trained on billions of tokens) scores
24.89 on C-Eval and 25.38 on CMMLU, chance being 25: still not enough knowledge for an exam.

The skill questions are different: the answer is in the question (copy it, take its first
word, the larger of two numbers) and the model learned the operation. A benchmark made of
such questions would put the model far above chance. So a score near chance on C-Eval says
"this model knows few exam facts", not "this model learned nothing": the held-out text's
bits per byte and the skill questions say what it learned.

One more detail the chat format exposes. lm-eval moves a context's trailing whitespace into
the continuation (section 1), and the chat template ends with `</think>\n\n`: so with
`--apply_chat_template` every choice's log-likelihood starts with the template's `\n\n`
tokens, which an answer-only SFT model was never trained to predict (notebook 05: the prompt
positions carry no loss). The cost is the same for every choice, so `acc` does not move, but
it is part of each $\ell$ lm-eval reports:"""),
(CODE, r"""chat_item = held_out_items([questions[0]], pool=records, fmt="chat")[0]
ctx, cont = encode_pair(tokenizer, chat_item.context, chat_item.choices[0])
print("context ends", [tokenizer.decode([i]) for i in ctx[-2:]], "| continuation starts",
      [tokenizer.decode([i]) for i in cont[:3]])
with torch.no_grad():
    logp = F.log_softmax(model(torch.tensor([ctx + cont])).logits[0], -1)   # (T, V)
template_cost = -sum(logp[len(ctx) - 1 + t, cont[t]].item() for t in range(2))
print(f"the two moved newline tokens cost {template_cost:.1f} nats, the same for all 4 choices")
assert [tokenizer.decode([i]) for i in cont[:2]] == ["\n", "\n"]"""),
(MD, r"""## 4 · The same figures from lm-evaluation-harness

lm-eval talks to a model through three requests: `loglikelihood` (context, continuation) ->
(log-likelihood, is it the greedy continuation), `loglikelihood_rolling` (a text's
log-likelihood, for perplexity tasks) and `generate_until` (greedy text up to a stop
string). `minimind_lib.inference.harness.MiniMindLM` answers them with the functions above
and registers itself as lm-eval's model `"minimind"`. Below, the 480 plain items go into a
jsonl file, a five-line YAML task describes them to lm-eval (`doc_to_text`, `doc_to_choice`,
`doc_to_target`), and `lm_eval.simple_evaluate` runs the course's model on it, offline. Its
`acc` and `acc_norm` must be the course's. (lm-eval comes with `make test`, or
`pip install -e '.[eval]'`; without it this cell says so and moves on.)"""),
(CODE, r"""# NBVAL_IGNORE_OUTPUT
if importlib.util.find_spec("lm_eval") is None:
    print("lm-eval is not installed: pip install -e '.[eval]' (make test installs it); skipping this cell")
    harness_results = None
else:
    from minimind_lib.inference import harness
    task_dir = Path(tempfile.mkdtemp())
    with open(task_dir / "course_mc.jsonl", "w", encoding="utf-8") as f:
        for it in plain_items:
            f.write(json.dumps({"context": it.context, "choices": it.choices, "gold": it.gold}, ensure_ascii=False) + "\n")
    (task_dir / "course_mc.yaml").write_text(f'''task: course_mc
dataset_path: json
dataset_kwargs:
  data_files: {{test: {task_dir / "course_mc.jsonl"}}}
  cache_dir: {task_dir / "cache"}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
''')
    lm = harness.MiniMindLM(model=model, tokenizer=tokenizer)
    harness_results = harness.run_tasks(lm, ["course_mc"], include_path=str(task_dir))["results"]["course_mc"]
    print(json.dumps({k: v for k, v in harness_results.items() if k.startswith("acc")}, indent=1))"""),
(CODE, r"""if harness_results is not None:
    assert harness_results["acc,none"] == scores["plain"]["all"].acc
    assert harness_results["acc_norm,none"] == scores["plain"]["all"].acc_norm
    print(f"lm-eval: acc {harness_results['acc,none']:.4f}, acc_norm {harness_results['acc_norm,none']:.4f} = the course's scorer")"""),
(MD, r"""**Bits per byte.** Perplexity is per *token*: a tokenizer with longer tokens predicts fewer,
harder tokens, so two models' perplexities only compare when they share a tokenizer. Divide
the summed negative log-likelihood by $\ln 2$ times the UTF-8 **bytes** of the text instead
and the unit no longer depends on the tokenizer (the measure of "The Pile", Gao et al. 2020;
lm-eval reports it for its perplexity tasks). Below, on the held-out text, for a fresh
untrained model (about $\log_2 6400 = 12.6$ bits per token spread over the bytes a token
spells), the shipped model, and your own run's models where they exist. And lm-eval's
`loglikelihood_rolling` of a text is the course's `text_logprobs`: each text on its own,
every token predicted once after `<|endoftext|>`, which `perplexity(..., per_text=True)` turns
into a perplexity."""),
(CODE, r"""held_out_text = eval_files("pretrain")[0]
seed_everything(profile.seed)
fresh = MiniMindForCausalLM(MiniMindConfig(**{**model.config.to_dict(), "dropout": 0.0})).eval()
candidates = {"fresh (random weights)": (fresh, tokenizer), "shipped (data/reference/sft)": (model, tokenizer)}
for stage in ("pretrain", "sft", "dpo"):
    folder = profile.runs_dir / stage
    if (folder / "stage.json").is_file():
        candidates[f"your {profile.name} {stage}"] = load_for_serving(folder, "cpu")
bpb = {name: bits_per_byte(m, tok, held_out_text, context=256, max_tokens=20_000) for name, (m, tok) in candidates.items()}
for name, value in bpb.items():
    print(f"{name:32} {value:.3f} bits per byte")
texts = [json.loads(line)["text"] for line in held_out_text.open(encoding="utf-8")][:4]
n_tokens = sum(len(tokenizer.encode(t, set())) for t in texts)
rolling = text_logprobs(model, tokenizer, texts)
ppl = perplexity(model, tokenizer, texts, model.config.max_position_embeddings, per_text=True)
print(f"4 texts, {n_tokens} tokens: exp(-sum of rolling log-likelihoods / tokens) = {math.exp(-sum(rolling) / n_tokens):.2f} = per-text perplexity {ppl:.2f}")
assert abs(math.exp(-sum(rolling) / n_tokens) / ppl - 1) < 1e-9
assert bpb["shipped (data/reference/sft)"] < bpb["fresh (random weights)"]"""),
(MD, r"""**What you should see** (every profile). The fresh model needs 4.2-4.4 bits per byte:
its 12.6 bits a token spread over about 3 bytes a token, knowing nothing. The shipped model
needs 2.60-2.72, 35-40% fewer: that is what pretraining and SFT taught it about text.
Your own run's models appear when you have trained them (in smoke, a tiny model after a few
hundred steps lands between the two). The per-text perplexity equals the rolling
log-likelihood's to the last digit: the same windows, the same scoring loop."""),
(CODE, r"""QUOTED = {"fresh": (4.2, 4.4, "{:.1f}"), "shipped": (2.60, 2.72, "{:.2f}"), "fewer bits": (0.35, 0.40),
          "log2 of the vocabulary": (12.6, 12.6, "{:.1f}")}
check_quoted(QUOTED, {"fresh": bpb["fresh (random weights)"], "shipped": bpb["shipped (data/reference/sft)"],
                      "log2 of the vocabulary": math.log2(model.config.vocab_size),
                      "fewer bits": 1 - bpb["shipped (data/reference/sft)"] / bpb["fresh (random weights)"]})"""),
(MD, r"""## 5 · MiniMind's published numbers, and yours

MiniMind's README ("Ⅴ 客观评测") reports, for minimind-3 (64M) and minimind-3-moe (198M), in
% **acc**, from

```bash
lm_eval --model hf --model_args pretrained=/path/to/model,dtype=auto --tasks <task> \
        --batch_size 16 --device cpu --trust_remote_code --apply_chat_template
```

| model | C-Eval | CMMLU | ARC-e | PIQA | OBQA | HellaSwag | SIQA |
|---|---:|---:|---:|---:|---:|---:|---:|
| minimind-3 | 24.89 | 25.38 | 28.49 | 50.65 | 23.60 | 28.28 | 34.19 |
| minimind-3-moe | 25.48 | 24.32 | 27.74 | 50.71 | 26.20 | 27.43 | 34.03 |
| chance | 25 | 25 | 25 | 50 | 25 | 25 | 33.3 |

Every one of them is within 4 points of chance (ARC-Easy has 4 choices, PIQA 2, Social-IQa 3):
at 64M parameters, as above, the tests measure knowledge the model does not have. The same
harness runs the course's model: fetch the datasets once (the one command that downloads
them), then score offline:

```bash
python -m minimind_lib download bench            # the 7 tasks' datasets -> the Hugging Face cache
python -m minimind_lib bench --model runs/cpu/sft --apply_chat_template   # one table, beside MiniMind's
python -m minimind_lib bench --model runs/cpu/sft --tasks arc_easy,piqa --limit 200 --json
python -m minimind_lib bench --model DIR --tasks my_task --include_path my_tasks/   # your own YAML task
```

`benchmarks/mc_bench.py` prints the held-out multiple-choice table and bits per byte for every
model it finds (smoke, cpu, the shipped one, MiniMind's weights when downloaded); its
figures are in docs/benchmarks.md ("Benchmarks as the field reports them"), and every
stage's `eval.json` / `report.md` now carries the multiple-choice table."""),
(MD, r"""## Now in the library

* `minimind_lib.evaluation.multiple_choice`: `encode_pair` (lm-eval's split),
  `continuation_logprobs` (the one scoring loop: log-likelihood and greedy flag of many rows,
  batched), `choice_logprobs`, `mc_metrics` (`acc`, `acc_norm` per character, chance),
  `held_out_items` / `held_out_mc` (the held-out questions as multiple choice, two formats);
* `minimind_lib.evaluation.perplexity`: `rolling_windows`, `text_logprobs` (lm-eval's
  `loglikelihood_rolling`), `perplexity(..., per_text=True)`, `bits_per_byte`;
* `minimind_lib.inference.harness`: `MiniMindLM` (lm-eval's `"minimind"` model), `run_tasks`,
  `bench`; `python -m minimind_lib bench` and `download bench`;
* `eval.json` / `report.md`: a multiple-choice table for every evaluated model."""),
]

SOLUTIONS = [
(MD, r"""# 17 · Benchmarks — worked answers

The exercises of `notebooks/17_benchmarks.ipynb`, answered. Try them there first."""),
(CODE, r"""from minimind_lib.course.exercises import exercise"""),
(MD, r"""**Exercise 17.1 · The split.** Whitespace first, then one encoding of the whole text; the
continuation is the tail after the context's own ids."""),
(CODE, r"""def split_pair(tokenizer, context, continuation):
    if not context:
        return [tokenizer.token_to_id("<|endoftext|>")], tokenizer.encode(continuation)
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = tokenizer.encode(context)
    return ctx, tokenizer.encode(context + continuation)[len(ctx):]"""),
(CODE, r"""assert exercise("17.1", split_pair)"""),
(MD, r"""**Exercise 17.2 · The picks.** `max` over the indices with a key; `-k` in the key breaks
ties toward the first index."""),
(CODE, r"""def picks(lls, choices):
    raw = max(range(len(lls)), key=lambda k: (lls[k], -k))
    norm = max(range(len(lls)), key=lambda k: (lls[k] / len(choices[k]), -k))
    return raw, norm"""),
(CODE, r"""assert exercise("17.2", picks)"""),
]


def notebook(cells: list[tuple[str, str]], name: str) -> dict:
    out = []
    for k, (kind, text) in enumerate(cells):
        cid = hashlib.sha1(f"{name}:{k}:{kind}".encode()).hexdigest()[:8]
        cell = {"cell_type": kind, "id": cid, "metadata": {}, "source": text.splitlines(True)}
        if kind == CODE:
            cell |= {"execution_count": None, "outputs": []}
        out.append(cell)
    return {"cells": out, "metadata": {"kernelspec": {"display_name": "Python 3",
                                                      "language": "python", "name": "python3"},
                                       "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


if __name__ == "__main__":
    for cells, path in ((CELLS, ROOT / "notebooks" / "17_benchmarks.ipynb"),
                        (SOLUTIONS, ROOT / "notebooks" / "solutions" / "17_benchmarks.ipynb")):
        path.write_text(json.dumps(notebook(cells, path.stem + path.parent.name), indent=1,
                                   ensure_ascii=False) + "\n", encoding="utf-8")
        print(path)
