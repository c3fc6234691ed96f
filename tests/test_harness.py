"""lm-evaluation-harness runs the course's model (issue 34), offline: a local multiple-choice
task and a local perplexity task (YAML tasks over jsonl files written here) go through
``lm_eval.simple_evaluate`` itself, and its figures equal the course's own scorers:
``acc`` / ``acc_norm`` = ``score_multiple_choice``, and the rolling log-likelihood behind its
``bits_per_byte`` = the course's per-text perplexity. Skipped, saying why, without lm-eval
(``make eval-harness`` or ``pip install -e '.[eval]'``; ``make test`` installs it)."""

from __future__ import annotations

import contextlib
import json
import math
import random

import pytest
import torch

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-evaluation-harness is not installed: `make eval-harness` or "
                      "pip install -e '.[eval]' (make test installs it)")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from minimind_lib import DATA_DIR  # noqa: E402
from minimind_lib.__main__ import main  # noqa: E402
from minimind_lib.evaluation.multiple_choice import (  # noqa: E402
    continuation_logprobs,
    held_out_items,
    score_multiple_choice,
)
from minimind_lib.evaluation.perplexity import (  # noqa: E402
    perplexity,
    rolling_windows,
    text_logprobs,
)
from minimind_lib.evaluation.questions import load_eval_records, select_per_task  # noqa: E402
from minimind_lib.inference import harness  # noqa: E402
from minimind_lib.inference.loading import load_for_serving  # noqa: E402
from minimind_lib.model.generation import generate_many  # noqa: E402
from minimind_lib.tokenizer.chat import encode_chat  # noqa: E402

REFERENCE = DATA_DIR / "reference" / "sft"
TEXTS = ["The river runs past the mill and on to the sea.",
         "床前明月光，疑是地上霜。举头望明月，低头思故乡。" * 3,
         "A longer text, " + "word after word " * 60 + "until it ends."]

#: a local task over a jsonl file (lm-eval reads it with the datasets library's json builder)
TASK_HEAD = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
"""
MC_YAML = TASK_HEAD + """output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: gold
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""
ROLLING_YAML = TASK_HEAD + """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The reference model, its MC items, both tasks on disk, and lm-eval's results."""
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    model, tok = load_for_serving(REFERENCE, "cpu")
    items = held_out_items(select_per_task(load_eval_records(), 4))
    with open(root / "mc.jsonl", "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps({"context": item.context, "choices": item.choices,
                                "gold": item.gold}, ensure_ascii=False) + "\n")
    with open(root / "text.jsonl", "w", encoding="utf-8") as f:
        for text in TEXTS:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    for name, task, yaml in (("mc", "course_mc", MC_YAML), ("text", "course_text", ROLLING_YAML)):
        (root / f"{name}.yaml").write_text(yaml.format(task=task, data=root / f"{name}.jsonl",
                                                       cache=root / "cache"))
    lm = harness.MiniMindLM(model=model, tokenizer=tok, batch_size=7)
    results = harness.run_tasks(lm, ["course_mc", "course_text"], include_path=str(root))
    return {"root": root, "model": model, "tok": tok, "items": items, "lm": lm,
            "results": results["results"]}


def test_lm_eval_multiple_choice_equals_the_course_scorer(setup):
    ours = score_multiple_choice(setup["model"], setup["tok"], setup["items"])
    theirs = setup["results"]["course_mc"]
    assert theirs["acc,none"] == pytest.approx(ours.acc, abs=1e-12)
    assert theirs["acc_norm,none"] == pytest.approx(ours.acc_norm, abs=1e-12)
    assert ours.n == 48 and ours.acc > ours.chance  # the reference model knows some answers


def test_lm_eval_rolling_loglikelihood_equals_the_course_perplexity(setup):
    model, tok, lm = setup["model"], setup["tok"], setup["lm"]
    lls = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), 0)
                                    for t in TEXTS])
    n_tokens = sum(len(tok.encode(t, set())) for t in TEXTS)
    course = perplexity(model, tok, TEXTS, model.config.max_position_embeddings, per_text=True)
    assert math.exp(-sum(lls) / n_tokens) == pytest.approx(course, rel=1e-6)
    # ... and lm-eval's own bits_per_byte metric is those log-likelihoods per UTF-8 byte
    n_bytes = sum(len(t.encode("utf-8")) for t in TEXTS)
    bpb = setup["results"]["course_text"]["bits_per_byte,none"]
    assert bpb == pytest.approx(-sum(lls) / (n_bytes * math.log(2)), rel=1e-6)


def test_rolling_windows_are_lm_evals():
    rng = random.Random(0)
    for _ in range(200):
        ids, seq_len = list(range(rng.randint(1, 40))), rng.randint(1, 12)
        theirs = [make_disjoint_window(w)
                  for w in get_rolling_token_windows(ids, -1, seq_len, context_len=1)]
        assert rolling_windows(ids, -1, seq_len) == [(list(a), list(b)) for a, b in theirs]


def test_short_windows_score_the_same_text(setup):
    """Cut into windows of 8 tokens, a text scores what lm-eval's windows say, each window one
    forward pass (checked against the one-pass score of the windows written out)."""
    model, tok = setup["model"], setup["tok"]
    (one_pass,) = text_logprobs(model, tok, TEXTS[:1])
    (windowed,) = text_logprobs(model, tok, TEXTS[:1], seq_len=8)
    assert windowed < one_pass + 1.0  # less context, a worse (lower) log-likelihood...
    assert windowed == pytest.approx(one_pass, rel=0.5)  # ...of the same text


def test_loglikelihood_answers_greedy_and_generation_stops(setup):
    model, tok, lm = setup["model"], setup["tok"], setup["lm"]
    messages = [{"role": "user", "content": "2 + 7 是多少？"}]
    ctx = lm.apply_chat_template(messages)
    assert tok.encode(ctx) == encode_chat(tok, messages, add_generation_prompt=True)
    (text,) = lm.generate_until([Instance("generate_until", {}, (ctx, {"until": [" ="],
                                                                     "max_gen_toks": 24}), 0)])
    assert text == "2 + 7"  # the greedy reply is "2 + 7 = 8", cut at the stop string
    # greedy: every continuation token is the argmax (ids, not re-tokenised text)
    reply = generate_many(model, [tok.encode(ctx)], 12, eos_token_id=tok.token_to_id("<|im_end|>"))
    ((ll, greedy), (ll2, greedy2)) = continuation_logprobs(
        model, [(tok.encode(ctx), reply[0]), (tok.encode(ctx), tok.encode("xq zebra"))])
    assert greedy and not greedy2 and ll > ll2
    # lm-eval moves the context's trailing "\n\n" into the continuation: the same reply then
    # pays for template tokens an answer-only SFT model never learned to predict
    ((ll_text, _),) = lm.loglikelihood([Instance("loglikelihood", {}, (ctx, "2 + 7 = 8"), 0)])
    assert ll_text < ll - 5
    with pytest.raises(ValueError, match="greedily"):
        lm.generate_until([Instance("generate_until", {}, (ctx, {"do_sample": True,
                                                                 "temperature": 1.0}), 0)])


@pytest.fixture
def offline(monkeypatch):
    """bench sets the Hub's offline flags unless set: set them here, so they do not outlive
    the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_bench_prints_one_table_from_the_cli(setup, capsys, offline):
    root = setup["root"]
    assert main(["bench", "--model", str(REFERENCE), "--tasks", "course_mc", "--include_path",
                 str(root), "--device", "cpu", "--limit", "12"]) == 0
    out = capsys.readouterr().out
    assert "| course_mc |" in out and "minimind-3 (64M) acc %" in out
    assert main(["bench", "--model", str(REFERENCE), "--tasks", "course_mc", "--include_path",
                 str(root), "--device", "cpu", "--limit", "12", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["tasks"]
    assert row["task"] == "course_mc" and 0 <= row["acc"] <= 1


def test_bench_refuses_bad_input_in_one_line(setup, capsys, offline):
    root = setup["root"]
    assert main(["bench", "--model", str(root / "nope"), "--tasks", "arc_easy"]) == 1
    assert "no such folder or file" in capsys.readouterr().err
    assert main(["bench", "--model", str(REFERENCE), "--tasks", "no_such_task",
                 "--include_path", str(root)]) == 1
    assert "unknown lm-eval task(s): no_such_task" in capsys.readouterr().err
    assert main(["download", "model", "--tasks", "arc_easy"]) == 1
    assert "--tasks and --include_path go with `download bench`" in capsys.readouterr().err
    assert main(["download", "bench", "--tasks", "no_such_task"]) == 1  # refused before fetching
    assert "unknown lm-eval task(s): no_such_task" in capsys.readouterr().err
    assert main(["bench", "--model", str(REFERENCE), "--limit", "0"]) == 1
    assert "--limit must be positive" in capsys.readouterr().err
    assert main(["bench", "--model", str(REFERENCE), "--num_fewshot", "-1"]) == 1  # issue 49
    assert "--num_fewshot must be 0 or more, got -1" in capsys.readouterr().err


def test_a_yaml_task_that_does_not_parse_is_named_not_called_unknown(tmp_path, capsys, offline):
    """Issue 49: lm-eval skips a YAML file it cannot parse, so its task was 'unknown'."""
    (tmp_path / "good.yaml").write_text("task: fine_task\nprocess_docs: !function utils.f\n")
    (tmp_path / "broken.yaml").write_text("task: my_task\ndataset_path: [unclosed\n")
    assert main(["bench", "--model", str(REFERENCE), "--tasks", "my_task",
                 "--include_path", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "a task file does not parse" in err and "broken.yaml:3:1" in err
    assert "good.yaml" not in err and "unknown lm-eval task" not in err


def test_lm_evals_own_cli_runs_the_course_model_without_a_device_flag(setup, capsys, offline):
    """Issue 49.9: ``lm_eval --model minimind`` could not find the model (lm-eval discovers
    no plugins), and without ``--device`` lm-eval hands the adapter "cuda", which a CPU machine
    lacks: the adapter now falls back with a warning."""
    root = setup["root"]
    with pytest.warns(UserWarning, match="not available on this machine") if not \
            torch.cuda.is_available() else contextlib.nullcontext():
        code = main(["lm-eval", "run", "--model", "minimind", "--model_args",
                     f"pretrained={REFERENCE}", "--tasks", "course_mc", "--include_path",
                     str(root), "--limit", "8", "--batch_size", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "course_mc" in out and "acc" in out
