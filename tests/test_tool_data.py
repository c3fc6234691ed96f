"""The tool-use data (scripts/build_tool_data.py) and its evaluation (evaluation.tool_use):
the bundled files are what the script builds, every answer is the executor's, held-out
questions are unseen, every record fits the cpu profile's SFT window, and the scores count what
they say (a scripted model that calls right scores 100%, one that never calls 0%)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from minimind_lib import DATA_DIR, REPO_ROOT
from minimind_lib.course.profiles import get_profile
from minimind_lib.data.conversations import SFTDataset
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.evaluation import tool_use
from minimind_lib.evaluation.tool_use import evaluate_tools, same_arguments, tool_table
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.tools import execute_tool

TOK = load_tokenizer()
TRAIN = list(read_jsonl(DATA_DIR / "sft_tools.jsonl", "sft"))
HELD = list(read_jsonl(DATA_DIR / "eval/tools_eval.jsonl", "sft"))


def question(record):
    return next(m["content"] for m in record["conversations"] if m["role"] == "user")


def test_the_bundled_files_are_the_scripts_output(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    import build_tool_data

    train, held = build_tool_data.build(DATA_DIR)
    assert train == TRAIN and held == HELD  # deterministic, and committed as built
    build_tool_data.write_jsonl(tmp_path / "t.jsonl", train[:3])
    assert (tmp_path / "t.jsonl").read_bytes().splitlines() == \
        (DATA_DIR / "sft_tools.jsonl").read_bytes().splitlines()[:3]


def test_every_answer_is_the_executors_and_every_call_is_in_the_offered_tools():
    for r in TRAIN + HELD:
        turns = r["conversations"]
        assert turns[-1]["content"] == r["answer"]
        if r["call"] is None:
            assert not any(m.get("tool_calls") for m in turns)
            continue
        offered = [t["function"]["name"] for t in json.loads(turns[0]["tools"])]
        assert r["call"]["name"] in offered
        assert json.loads(turns[2]["tool_calls"]) == [r["call"]]
        assert turns[3] == {"role": "tool", "content": execute_tool(r["call"]["name"],
                                                                  r["call"]["arguments"])}
        assert str(json.loads(turns[3]["content"])["result"]) in r["answer"] or \
            r["tool_task"] == "weekday"  # the Chinese reply names the weekday in Chinese


def test_held_out_questions_and_poems_are_unseen_and_every_kind_is_there():
    assert not {question(r) for r in HELD} & {question(r) for r in TRAIN}
    titles = {r["call"]["arguments"]["title"] for r in TRAIN if r["tool_task"] == "poem_author"}
    held_titles = {r["call"]["arguments"]["title"] for r in HELD if r["tool_task"] == "poem_author"}
    assert held_titles and not titles & held_titles
    assert Counter(r["tool_task"] for r in HELD) == {k: 100 for k in (
        "calculate", "convert_units", "days_between", "weekday", "poem_author", "no_tool",
        "multi_step")}
    thinking = [r for r in TRAIN if r["tool_task"] == "multi_step"]
    assert 0.4 < sum("reasoning_content" in r["conversations"][-1] for r in thinking) \
        / len(thinking) < 0.6  # half think, half answer directly


def test_sft_reads_the_tool_data_and_every_record_fits_the_cpu_window():
    assert dataset_files("sft")[-1] == DATA_DIR / "sft_tools.jsonl"
    seq_len = get_profile("cpu").sft.seq_len
    data = SFTDataset(TRAIN, TOK, seq_len + 1, progress=False)
    assert len(data) == len(TRAIN) and data.lengths.max() <= seq_len
    # the call and the answer are supervised; the schemas and the tool's result are not
    example = data[TRAIN.index(next(r for r in TRAIN if r["tool_task"] == "calculate"))]
    supervised = TOK.decode([t for t in example["labels"].tolist() if t >= 0])
    assert '"name": "calculate"' in supervised and "<tool_response>" not in supervised
    assert '"description"' not in supervised


def test_arguments_compare_after_parsing():
    assert same_arguments({"title": "《静夜思》"[1:-1]}, {"title": "静夜思"})
    assert not same_arguments({"value": "3"}, {"value": 3})
    assert not same_arguments({"value": True}, {"value": 1})
    assert not same_arguments({"expression": "2+3"}, {"expression": "2*3"})
    assert not same_arguments({}, {"date": "2026-01-01"})


class Oracle(torch.nn.Module):
    """A stand-in model that answers every held-out question as its record does (the call,
    then the answer), or, with ``calls`` False, always replies with the reference answer."""

    def __init__(self, records, calls=True):
        super().__init__()
        self.by_question = {question(r): r for r in records}
        self.calls = calls
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config = type("Config", (), {"max_position_embeddings": 4096})()

    def generate(self, input_ids, max_new_tokens, **kwargs):
        prompt = TOK.decode(input_ids[0].tolist())
        r = next(r for q, r in self.by_question.items() if f"user\n{q}<|im_end|>" in prompt)
        if r["tool_task"] == "multi_step" and prompt.endswith("<think>\n"):
            steps = r["answer"].split(" = ")[0]
            reply = f"{steps} step\n</think>\n\n{r['answer']}"
        elif self.calls and r["call"] and "<tool_response>" not in prompt and "<tools>" in prompt:
            reply = "<tool_call>\n" + json.dumps(r["call"], ensure_ascii=False) + "\n</tool_call>"
        else:
            reply = r["answer"]
        ids = TOK.encode(reply) + [TOK.token_to_id("<|im_end|>")]
        return torch.cat([input_ids, torch.tensor([ids])], dim=1)


def test_an_oracle_scores_full_marks_and_a_model_that_never_calls_scores_no_calls():
    perfect = evaluate_tools(Oracle(HELD), TOK, per_task=3, progress=False)
    assert set(perfect) == {r["tool_task"] for r in HELD}
    for task, scores in perfect.items():
        assert scores["n"] == 3
        wanted = {"false_calls": 0.0, "wrote_reasoning": 1.0}
        assert all(v == wanted.get(k, 1.0) for k, v in scores.items() if k != "n"), (task, scores)
    never = evaluate_tools(Oracle(HELD, calls=False), TOK, per_task=2, progress=False)
    assert never["calculate"]["call_accuracy"] == 0.0
    assert never["calculate"]["with_tools"] == never["calculate"]["without_tools"] == 1.0
    assert "| calculate | 2 | 0.0% | 0.0% | 100.0% | 100.0% |" in tool_table(never)
    # the (grammar) columns: the oracle ignores a grammar, so they equal the free ones
    graded = evaluate_tools(Oracle(HELD), TOK, per_task=2, progress=False,
                            constrain=lambda tools, thinking: None)
    for scores in graded.values():
        for k, v in scores.items():
            if k.endswith("_grammar"):
                assert v == scores[k.removesuffix("_grammar")], (k, scores)
    assert graded["calculate"]["calls_parse_grammar"] == 1.0


def test_a_held_out_record_without_its_fields_is_named(tmp_path, monkeypatch):
    bad = tmp_path / "tools_eval.jsonl"
    bad.write_text(json.dumps({"conversations": HELD[0]["conversations"]}) + "\n")
    monkeypatch.setattr(tool_use, "eval_files", lambda schema: [bad])
    with pytest.raises(ValueError, match=r"tools_eval.jsonl: record 1: .*'tool_task'"):
        tool_use.load_tool_questions()
