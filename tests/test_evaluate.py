"""Evaluation: scores, greedy chat answers (batched == alone), perplexity, held-out files."""

import json
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import tiny_model as shared_tiny_model

from minimind_lib.data import DataFormatError
from minimind_lib.evaluation.perplexity import perplexity
from minimind_lib.evaluation.questions import (
    Answer,
    answer_budget,
    char_f1,
    evaluate_sft,
    exact_match,
    generate_answers,
    load_eval_records,
    prompt_messages,
    question_table,
    reference,
    reply,
    score_answers,
    select_per_task,
    summarize,
)
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.tokenizer import encode_chat, load_tokenizer

TOK = load_tokenizer()
IM_END, EOT = TOK.token_to_id("<|im_end|>"), TOK.token_to_id("<|endoftext|>")


def tiny_model(seed: int = 0) -> MiniMindForCausalLM:
    model = shared_tiny_model(seed, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=512)
    # larger weights than the 0.02 init: confident, varied greedy choices (no near-ties)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)
    return model.eval()


# --- scores --------------------------------------------------------------------------------

words = st.text(st.sampled_from("ab c李白。"), max_size=8)


@given(a=words, b=words)
def test_char_f1_is_a_symmetric_overlap_score(a, b):
    f = char_f1(a, b)
    assert 0.0 <= f <= 1.0 and f == pytest.approx(char_f1(b, a))
    same = Counter(a.replace(" ", "")) == Counter(b.replace(" ", ""))
    assert (f == 1.0) == same
    if exact_match(a, b):
        assert f == 1.0


def test_exact_match_and_char_f1_values():
    assert exact_match("李白\n", "李白") and not exact_match("李白。", "李白")
    assert char_f1("李白。", "李白") == pytest.approx(0.8)  # p = 2/3, r = 1
    assert char_f1("", "") == 1.0 and char_f1("", "x") == 0.0


def test_answer_format():
    assert Answer("7", ended=True).follows_format
    assert not Answer("7", ended=False).follows_format  # ran out of tokens
    assert not Answer("  ", ended=True).follows_format  # empty reply
    assert not Answer("7<|im_start|>user", ended=True).follows_format  # wrote a role marker


def test_reply_cuts_at_the_first_stop_and_flags_the_end_of_turn():
    li = TOK.encode("李白")
    assert reply(TOK, li + [IM_END, 9, 9]) == (li + [IM_END], Answer("李白", ended=True))
    # <|endoftext|> ends the row but is no turn end
    assert reply(TOK, li + [EOT, 9]) == (li + [EOT], Answer("李白", ended=False))
    assert reply(TOK, li) == (li, Answer("李白", ended=False))  # the budget ran out


def test_generate_answers_stops_at_the_budget():
    model, questions = tiny_model(), ["1 + 1?", "hello there", "你好"]
    full = generate_answers(model, TOK, questions, 12, progress=False)
    one = generate_answers(model, TOK, questions, 1, progress=False)
    for a, b in zip(full, one, strict=True):
        first = TOK.encode(a.text)[:1] if a.text else []
        assert b.text == TOK.decode(first) and (b.ended == (a.ended and not a.text))
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_answers(model, TOK, questions, 0, progress=False)


def test_generate_answers_batched_equals_one_at_a_time_and_model_generate():
    model = tiny_model()
    questions = ["1 + 1?", "2 + 2?", "3 + 3?", "hello there", "你好", [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]]
    batched = generate_answers(model, TOK, questions, 12, batch_size=64, progress=False)
    alone = generate_answers(model, TOK, questions, 12, batch_size=1, progress=False)
    # fp32 on one device: a batch changes at most float rounding, far below the logit gaps
    assert batched == alone
    for q, answer in zip(questions[:3], batched[:3], strict=True):
        ids = torch.tensor([encode_chat(TOK, [{"role": "user", "content": q}], True)])
        new = model.generate(ids, 12, temperature=0, eos_token_id=IM_END)[0, ids.shape[1]:].tolist()
        stop = new.index(IM_END) if IM_END in new else len(new)
        assert answer.text == TOK.decode(new[:stop]) and answer.ended == (IM_END in new)


# --- scoring per task ----------------------------------------------------------------------


RECORDS = [{"task": "add", "family": "skill", "answer": "2"},
           {"task": "add", "family": "skill", "answer": "4"},
           {"task": "poet", "family": "knowledge", "answer": "李白"},
           {"task": "poet", "family": "knowledge", "answer": "杜甫"}]
ANSWERS = [Answer("2", True), Answer("5", True), Answer("李白", True), Answer("李", False)]


def test_score_answers_summarize_and_table():
    scores = score_answers(RECORDS, ANSWERS)
    assert list(scores) == ["add", "poet"]
    assert ((scores["add"].exact_match, scores["add"].format_rate, scores["add"].char_f1)
            == (0.5, 1.0, 0.5))
    assert (scores["poet"].exact_match, scores["poet"].format_rate) == (0.5, 0.5)
    assert scores["poet"].char_f1 == pytest.approx((1.0 + 0.0) / 2)  # "李" vs "杜甫": no overlap
    pooled = summarize(scores)
    assert list(pooled) == ["skill", "knowledge", "all"]
    assert pooled["all"].n == 4 and pooled["all"].format_rate == 0.75
    table = question_table({"before": scores, "after": scores})
    assert table.splitlines()[0].startswith("| task | family | n | exact-match before | "
                                            "exact-match after")
    assert "| poet | knowledge | 2 | 50.0% | 50.0% | 50.0% | 50.0% | 50.0% | 50.0% |" in table
    assert "| **all** |  | 4 |" in table
    with pytest.raises(ValueError, match="4 records but 3 answers"):
        score_answers(RECORDS, ANSWERS[:3])


def test_evaluate_sft_scores_per_task_with_the_answer_budget():
    records = load_eval_records()
    chosen = select_per_task(records, 2)
    assert [r["task"] for r in chosen[:2]] == [chosen[0]["task"]] * 2
    assert (Counter(r["task"] for r in chosen)
            == Counter({t: 2 for t in {r["task"] for r in records}}))
    results = evaluate_sft(tiny_model(), TOK, records, per_task=2, progress=False)
    assert len(results) == 12 and all(r.n == 2 for r in results.values())
    # an untrained model never closes a turn, and it does not guess these answers
    assert all(r.format_rate == 0.0 and r.exact_match == 0.0 for r in results.values())


def test_held_out_records_and_their_checks(tmp_path):
    records = load_eval_records()
    assert (Counter(r["task"] for r in records)
            == Counter({t: 120 for t in {r["task"] for r in records}}))
    for r in records[:50]:
        assert reference(r) == r["conversations"][-1]["content"]
        assert prompt_messages(r) == r["conversations"][:-1]
    longest = max(len(TOK.encode(r["answer"], allowed_special=set())) for r in records)
    assert answer_budget(TOK, records) == longest + 1 + 8
    bad = tmp_path / "eval.jsonl"
    record = {"conversations": [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "a"}], "task": "t"}
    bad.write_text(json.dumps({**record, "answer": "a"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=r"eval\.jsonl: record 2: field 'answer'"):
        load_eval_records([bad])


# --- perplexity ----------------------------------------------------------------------------


def nll_sum(model, ids: list[int]) -> tuple[float, int]:
    """Reference: summed next-token NLL of one window, from the model's own loss."""
    t = torch.tensor([ids])
    with torch.no_grad():
        loss = model(t, labels=t).loss.item()  # mean over len(ids) - 1 predictions
    return loss * (len(ids) - 1), len(ids) - 1


def test_perplexity_is_exp_of_the_mean_token_nll_over_windows(tmp_path):
    model = tiny_model(1)
    texts = ["The cat sat on the mat.", "床前明月光，疑是地上霜。",
             "A third, longer line of text here."]
    stream = [i for t in texts for i in TOK.encode(t, allowed_special=set()) + [EOT]]
    seq_len = 7
    windows = [stream[s:s + seq_len + 1] for s in range(0, len(stream) - 1, seq_len)]
    assert len(windows[-1]) < seq_len + 1  # the test covers a short last window
    total, count = map(sum, zip(*(nll_sum(model, w) for w in windows), strict=True))
    assert count == len(stream) - 1  # every token after the first predicted once
    # reference sums per-window means back up in fp32: agreement to ~1e-5 relative
    expected = math.exp(total / count)
    assert perplexity(model, TOK, texts, seq_len, batch_size=3) == pytest.approx(expected, rel=1e-5)
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert perplexity(model, TOK, path, seq_len) == pytest.approx(expected, rel=1e-5)
    first = math.exp(nll_sum(model, stream[:seq_len + 1])[0] / seq_len)
    assert (perplexity(model, TOK, texts, seq_len, max_tokens=seq_len + 1)
            == pytest.approx(first, rel=1e-5))
    with pytest.raises(ValueError, match="seq_len must be positive"):
        perplexity(model, TOK, texts, 0)


@settings(max_examples=10, deadline=None)
@given(seq_len=st.integers(1, 40), batch_size=st.integers(2, 6))
def test_perplexity_does_not_depend_on_batching(seq_len, batch_size):
    model = tiny_model(2)
    texts = ["one two three four five six seven", "八九十"]
    alone = perplexity(model, TOK, texts, seq_len, batch_size=1)
    # fp32; batching changes float rounding only
    assert (perplexity(model, TOK, texts, seq_len, batch_size=batch_size)
            == pytest.approx(alone, rel=1e-5))
