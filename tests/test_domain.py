"""The LoRA fine-tune's task family (minimind_lib.data.hanzi_codes): right answers, a held-out
split that holds, new to the bundled SFT data, and short enough for the lora stage's sequences."""

from __future__ import annotations

import re

import pytest

from minimind_lib.course.profiles import PROFILE_NAMES, get_profile
from minimind_lib.data import read_jsonl
from minimind_lib.data.hanzi_codes import (
    NUMERALS,
    TASKS,
    TEMPLATES,
    _code_of,
    is_held_out,
    task_records,
    to_digits,
    to_hanzi,
)
from minimind_lib.data.readers import dataset_files
from minimind_lib.evaluation.questions import load_eval_records, reference
from minimind_lib.tokenizer import encode_chat, load_tokenizer


def test_answers_are_the_codes_read_out():
    for r in task_records("train", per_task=300, seed=5) + task_records("eval", per_task=100):
        code, prompt = _code_of(r), r["conversations"][0]["content"]
        assert r["answer"] == reference(r) == (to_hanzi(code) if r["task"] == "digits_to_hanzi"
                                               else code)
        assert (code if r["task"] == "digits_to_hanzi" else to_hanzi(code)) in prompt
        assert 3 <= len(code) <= 6 and to_digits(to_hanzi(code)) == code
    assert to_hanzi("0123456789") == NUMERALS


def test_held_out_codes_never_occur_in_training_records():
    train = {_code_of(r) for seed in range(3) for r in task_records("train", 2000, seed)}
    held = {_code_of(r) for r in task_records("eval", per_task=200)}
    assert not train & held
    assert all(is_held_out(c) for c in held) and not any(is_held_out(c) for c in train)


def test_records_are_deterministic_balanced_and_distinct_per_task():
    a, b = task_records("train", 400, seed=7), task_records("train", 400, seed=7)
    assert a == b and a != task_records("train", 400, seed=8)
    for task in TASKS:
        codes = [_code_of(r) for r in a if r["task"] == task]
        assert len(codes) == len(set(codes)) == 400
    assert [r["task"] for r in a[:4]] == list(TASKS) * 2
    used = {r["conversations"][0]["content"].split("“")[0][:6] for r in a}
    assert len(used) >= 5  # several templates in use


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="split must be"):
        task_records("test", 10)
    with pytest.raises(ValueError, match="per_task must be in"):
        task_records("eval", 0)
    with pytest.raises(ValueError, match="a code is a string of digits"):
        to_hanzi("4O7")
    with pytest.raises(ValueError, match="not a code in Chinese numerals"):
        to_digits("四〇七")


def test_the_task_is_new_to_the_bundled_sft_and_eval_data():
    # each template's longest fixed piece, e.g. "”写成阿拉伯数字。"
    phrases = [max(re.split(r"\{\w+\}", t), key=len) for ts in TEMPLATES.values() for t in ts]
    texts = [m["content"] for p in dataset_files("sft") for r in read_jsonl(p, "sft")
             for m in r["conversations"]]
    texts += [m["content"] for r in load_eval_records() for m in r["conversations"]]
    for phrase in phrases:
        assert not any(phrase in t for t in texts), phrase
    assert not {r["task"] for r in load_eval_records()} & set(TASKS)


@pytest.mark.parametrize("name", [p for p in PROFILE_NAMES if p != "auto"])
def test_every_conversation_fits_the_lora_stages_sequences(name):
    """Truncation would cut answers (and the <|im_end|> that ends them) off silently."""
    seq_len = get_profile(name).lora.seq_len
    tokenizer = load_tokenizer()
    longest = max(len(encode_chat(tokenizer, r["conversations"]))
                  for split, n in (("train", 3000), ("eval", 500))
                  for r in task_records(split, n))
    assert longest <= seq_len
