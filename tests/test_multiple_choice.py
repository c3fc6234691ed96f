"""Multiple-choice scoring (issue 34): each choice's log-likelihood equals the sum over its
tokens computed one forward pass at a time, batching changes nothing, the context/continuation
split follows lm-eval's, acc / acc_norm / chance count what they say; the held-out questions
as multiple choice; a text's rolling log-likelihood (lm-eval's ``loglikelihood_rolling``)."""

from __future__ import annotations

import math

import pytest
import torch
from tiny import tiny_model

from minimind_lib.evaluation.model_eval import mc_table
from minimind_lib.evaluation.multiple_choice import (
    MCItem,
    choice_logprobs,
    encode_pair,
    held_out_items,
    held_out_mc,
    mc_metrics,
    score_multiple_choice,
)
from minimind_lib.evaluation.perplexity import perplexity, rolling_windows, text_logprobs
from minimind_lib.evaluation.questions import load_eval_records, select_per_task
from minimind_lib.tokenizer import load_tokenizer

TOK = load_tokenizer()
ITEMS = [MCItem("The capital of France is ", ["Paris", "a small red bicycle", "Rome"], 0),
         MCItem("2 + 2 =", [" 4", " 5"], 0), MCItem("", ["hello", "world wide"], 1),
         MCItem("床前明月光，", ["疑是地上霜", "低头思故乡"], 0)]


def by_hand(model, context, choice):
    ctx, cont = encode_pair(TOK, context, choice)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1], return_logits=True).logits.double(), -1)
    return sum(logp[0, len(ctx) - 1 + t, tok].item() for t, tok in enumerate(cont))


def test_each_choice_scores_its_tokens_after_the_context_whatever_the_batch():
    model = tiny_model().eval()
    want = [[by_hand(model, i.context, c) for c in i.choices] for i in ITEMS]
    for batch_size in (1, 3, 64):
        got = choice_logprobs(model, TOK, ITEMS, batch_size=batch_size)
        for g, w in zip(got, want, strict=True):
            assert g == pytest.approx(w, abs=1e-4)


def test_the_split_moves_trailing_spaces_and_keeps_the_whole_texts_tokens():
    ctx, cont = encode_pair(TOK, "Answer: ", "yes")
    assert ctx + cont == TOK.encode("Answer: yes", set()) and TOK.decode(cont) == " yes"
    ctx, cont = encode_pair(TOK, "", "yes")
    assert ctx == [TOK.token_to_id("<|endoftext|>")] and cont == TOK.encode("yes", set())


def test_acc_acc_norm_and_chance_count_what_they_say():
    items = [MCItem("q", ["a", "bbbbbbbbbb"], 1), MCItem("q", ["a", "b", "c"], 2)]
    # item 1: raw prefers the short choice, per character the long one; item 2: c wins both
    scores = mc_metrics([[-2.0, -5.0], [-3.0, -3.0, -1.0]], items)
    assert (scores.acc, scores.acc_norm) == (0.5, 1.0)
    assert scores.chance == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert mc_metrics([[-1.0, -1.0]], [MCItem("q", ["x", "y"], 1)]).acc == 0.0  # ties: first


def test_a_model_scores_its_items_and_bad_items_are_refused():
    scores = score_multiple_choice(tiny_model(), TOK, ITEMS)
    assert scores.n == 4 and 0 <= scores.acc <= 1 and 0 <= scores.acc_norm <= 1
    with pytest.raises(ValueError, match="at least 2 choices"):
        MCItem("q", ["only"], 0)
    with pytest.raises(ValueError, match="gold in range"):
        MCItem("q", ["a", "b"], 2)
    with pytest.raises(ValueError, match="no multiple-choice items"):
        score_multiple_choice(tiny_model(), TOK, [])


def test_a_row_longer_than_the_context_keeps_its_end():
    model = tiny_model(max_position_embeddings=16).eval()
    long = MCItem("word " * 40, ["end", "stop"], 0)
    (lls,) = choice_logprobs(model, TOK, [long])
    assert all(torch.isfinite(torch.tensor(lls)))


# --- the held-out questions as multiple choice; a text's rolling log-likelihood -------------

RECORDS = load_eval_records()


def test_held_out_items_draw_distractors_from_the_same_task_stably():
    chosen = select_per_task(RECORDS, 3)
    items = held_out_items(chosen, pool=RECORDS)
    answers_of = {}
    for r in RECORDS:
        answers_of.setdefault(r["task"], set()).add(r["answer"])
    for item, record in zip(items, chosen, strict=True):
        assert len(set(item.choices)) == 4 and item.choices[item.gold] == record["answer"]
        assert set(item.choices) <= answers_of[record["task"]]
        assert item.context == f"Question: {record['conversations'][0]['content']}\nAnswer: "
    # the same question gets the same choices in any selection; another seed, others
    again = held_out_items(chosen[5:6], pool=RECORDS)
    assert again == items[5:6] and held_out_items(chosen[5:6], pool=RECORDS, seed=1) != again
    chat = held_out_items(chosen[:1], pool=RECORDS, fmt="chat")[0]
    assert chat.context.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert chat.choices == items[0].choices
    with pytest.raises(ValueError, match="too few for 4 choices"):
        held_out_items(chosen[:1])
    with pytest.raises(ValueError, match="fmt must be one of"):
        held_out_items(chosen, pool=RECORDS, fmt="html")


def test_held_out_mc_pools_tasks_families_and_all():
    chosen = select_per_task(RECORDS, 2)
    scores = held_out_mc(tiny_model(), TOK, chosen, pool=RECORDS)
    tasks = {r["task"] for r in chosen}
    assert set(scores) == tasks | {"family:skill", "family:knowledge", "all"}
    assert scores["all"].n == len(chosen) and scores["all"].chance == pytest.approx(0.25)
    assert sum(scores[t].acc * scores[t].n for t in tasks) == pytest.approx(
        scores["all"].acc * scores["all"].n)


def test_a_texts_rolling_loglikelihood_is_every_token_after_endoftext():
    model = tiny_model().eval()
    texts = ["one short text", "床前明月光，疑是地上霜。" * 4]
    eos = TOK.token_to_id("<|endoftext|>")
    for text, got in zip(texts, text_logprobs(model, TOK, texts), strict=True):
        ids = torch.tensor([[eos] + TOK.encode(text, set())])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids[:, :-1]).logits.double(), -1)  # (1, T, V)
        assert got == pytest.approx(logp[0].gather(1, ids[0, 1:, None]).sum().item(), abs=1e-3)
    n = sum(len(TOK.encode(t, set())) for t in texts)
    windows = text_logprobs(model, TOK, texts, seq_len=5)  # many windows, each one pass
    assert perplexity(model, TOK, texts, 5, per_text=True) == pytest.approx(
        math.exp(-sum(windows) / n), rel=1e-9)
    assert rolling_windows([], 0, 4) == [] and len(rolling_windows(list(range(9)), 0, 3)) == 3


def test_mc_table_reads_what_eval_json_stores():
    one = {"n": 4, "acc": 0.75, "acc_norm": 0.5, "chance": 0.25}
    table = mc_table({"pre": {"plain": {"family:skill": one, "all": one},
                              "chat": {"family:skill": one, "all": one}},
                      "sft": {"plain": {"family:skill": one, "all": one},
                              "chat": {"family:skill": one, "all": one}}})
    assert "| skill | chat | 25.0 | 75.0 / 50.0 | 75.0 / 50.0 |" in table
    assert table.count("\n| ") == 5  # header + 4 rows
