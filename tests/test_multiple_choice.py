"""Multiple-choice scoring (issue 34, started): each choice's log-likelihood equals the sum
over its tokens computed one forward pass at a time, batching changes nothing, the
context/continuation split follows lm-eval's, and acc / acc_norm / chance count what they say."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model

from minimind_lib.evaluation.multiple_choice import (
    MCItem,
    choice_logprobs,
    encode_pair,
    mc_metrics,
    score_multiple_choice,
)
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
