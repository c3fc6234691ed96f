"""Rollouts: checkable questions from the SFT data, the model's own answers (greedy sampling ==
the evaluation's greedy answers), the stop-token contract, and the rewards."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_model

from minimind_lib.data import read_jsonl
from minimind_lib.data.readers import dataset_files
from minimind_lib.evaluation.questions import Answer, generate_answers
from minimind_lib.tokenizer import END_OF_TEXT, IM_END, load_tokenizer
from minimind_lib.training.rollout import (
    Question,
    accuracy,
    is_correct,
    reply,
    sample_answers,
    select_tasks,
    verifiable_questions,
    verifiable_reward,
)

TOK = load_tokenizer()
END, EOT = TOK.token_to_id(IM_END), TOK.token_to_id(END_OF_TEXT)


def question(text: str, answer: str = "1") -> Question:
    return Question([{"role": "user", "content": text}], answer, "t", "skill")


def test_the_bundled_sft_data_holds_checkable_questions_of_every_skill_task():
    records = [r for p in dataset_files("sft") for r in read_jsonl(p, "sft")]
    skill = verifiable_questions(records, "skill")
    assert {q.task for q in skill} == {"arithmetic", "copy_en", "copy_zh", "extract_title",
                                       "first_word", "larger_number"}
    assert all(q.family == "skill" and q.messages[-1]["role"] == "user" for q in skill)
    chosen = verifiable_questions(records, "arithmetic, larger_number")
    assert {q.task for q in chosen} == {"arithmetic", "larger_number"}
    with pytest.raises(ValueError, match="unknown task or family 'arithmetics'; tasks: "):
        verifiable_questions(records, "arithmetics")


def test_select_tasks_takes_task_and_family_names():
    known = {"a": "skill", "b": "skill", "c": "knowledge"}
    assert select_tasks("skill", known) == {"a", "b"}
    assert select_tasks("c, a", known) == {"a", "c"}
    with pytest.raises(ValueError, match="families: knowledge, skill"):
        select_tasks("d", known)


def test_reply_cuts_at_the_first_stop_token_and_ends_only_on_im_end():
    seven = TOK.encode("7")
    assert reply(TOK, seven + [END, 5, 6]) == (seven + [END], Answer("7", True))
    assert reply(TOK, seven + [EOT, END]) == (seven + [EOT], Answer("7", False))
    assert reply(TOK, seven * 3) == (seven * 3, Answer("777", False))  # ran out of budget


def test_greedy_sampling_equals_the_evaluations_greedy_answers():
    model = tiny_model()
    questions = [question("7 和 3 哪个大？"), question("Which is larger, 72 or 8?"),
                 question("1 和 2 哪个大？")]  # two prompt lengths: two batches
    greedy = sample_answers(model, TOK, questions, 3, max_new_tokens=6, temperature=0.0)
    expected = generate_answers(model, TOK, [q.messages for q in questions], 6, progress=False)
    for group, answer in zip(greedy, expected, strict=True):
        assert len(group) == 3 and all(s.answer == answer for s in group)
        assert all(s.response == group[0].response for s in group)


def test_sampling_is_reproducible_and_keeps_the_prompt_and_the_models_mode():
    model = tiny_model().train()
    questions = [question("7 和 3 哪个大？"), question("Which is larger, 72 or 8?")]
    runs = [sample_answers(model, TOK, questions, 4, max_new_tokens=5,
                           generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert model.training
    tokens = [[s.response for g in run for s in g] for run in runs]
    assert tokens[0] == tokens[1] and tokens[0] != tokens[2]
    for q, group in zip(questions, runs[0], strict=True):
        for s in group:
            assert 1 <= len(s.response) <= 5
            assert reply(TOK, s.response) == (s.response, s.answer)
            assert TOK.decode(s.prompt).endswith(q.messages[-1]["content"] + "<|im_end|>\n"
                                                 "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with pytest.raises(ValueError, match="must be positive"):
        sample_answers(model, TOK, questions, 0, max_new_tokens=5)


def test_rewards_use_the_evaluations_checker():
    assert is_correct(Answer(" 7 ", True), "7") and not is_correct(Answer("7", False), "7")
    assert not is_correct(Answer("7<|im_start|>", True), "7")
    assert verifiable_reward(Answer("7", True), "7", format_weight=0.5) == 1.5
    assert verifiable_reward(Answer("8", False), "7", format_weight=0.5) == 0.0
    assert verifiable_reward(Answer("1 + 2 = 4", True), "1 + 2 = 3", kind="char_f1") == \
        pytest.approx(0.8)
    with pytest.raises(ValueError, match="choose one of exact, char_f1"):
        verifiable_reward(Answer("7", True), "7", kind="f1")
    q = question("?", "7")
    groups = sample_answers(tiny_model(), TOK, [q], 4, max_new_tokens=3,
                            generator=torch.Generator().manual_seed(0))
    assert accuracy(groups, [q]) == sum(is_correct(s.answer, "7") for s in groups[0]) / 4
