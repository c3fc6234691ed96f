"""read_jsonl rejects malformed input with file:line and the reason, for all three schemas."""

import json

import pytest

from minimind_lib.data import DataFormatError, read_jsonl
from minimind_lib.data.readers import dataset_files

USER = {"role": "user", "content": "1 + 1 等于多少？"}
ASSISTANT = {"role": "assistant", "content": "1 + 1 = 2"}


def write(tmp_path, lines, name="x.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
                              for x in lines) + "\n", encoding="utf-8")
    return path


def test_valid_files_round_trip(tmp_path):
    pre = write(tmp_path, [{"text": "床前明月光"}, "", {"text": "hello", "extra": 1}])
    assert [r["text"] for r in read_jsonl(pre, "pretrain")] == ["床前明月光", "hello"]
    sft = write(tmp_path, [{"conversations": [USER, ASSISTANT]}], "s.jsonl")
    assert len(list(read_jsonl(sft, "sft"))) == 1
    dpo = write(tmp_path, [{"chosen": [USER, ASSISTANT], "rejected": [USER, ASSISTANT]}], "d.jsonl")
    assert len(list(read_jsonl(dpo, "dpo"))) == 1


@pytest.mark.parametrize(
    ("schema", "bad", "message"),
    [
        ("pretrain", '{"text": "ok"', "not valid JSON"),
        ("pretrain", {"txt": "x"}, "field 'text' is missing"),
        ("pretrain", {"text": 3}, "field 'text' must be a string"),
        ("pretrain", {"text": "  "}, "field 'text' is empty"),
        ("pretrain", [1, 2], "expected a JSON object"),
        ("sft", {"conversation": []}, "field 'conversations' is missing"),
        ("sft", {"conversations": []}, "empty conversation"),
        ("sft", {"conversations": [USER, {"role": "bot", "content": "x"}]},
         r"conversations\[1\].role is 'bot'"),
        ("sft", {"conversations": [USER, {"role": "assistant"}]},
         r"conversations\[1\] has no 'content'"),
        ("sft", {"conversations": [USER, {"role": "assistant", "content": None}]},
         "content must be a string"),
        ("sft", {"conversations": [USER]}, "no assistant message"),
        ("sft", {"conversations": "hi"}, "must be a list of messages"),
        ("dpo", {"chosen": [USER, ASSISTANT]}, "field 'rejected' is missing"),
        ("dpo", {"chosen": [USER, ASSISTANT], "rejected": [ASSISTANT, USER]},
         "must end with an assistant"),
    ],
)
def test_bad_line_names_file_line_and_problem(tmp_path, schema, bad, message):
    good = {"pretrain": {"text": "fine"},
            "sft": {"conversations": [USER, ASSISTANT]},
            "dpo": {"chosen": [USER, ASSISTANT], "rejected": [USER, ASSISTANT]}}[schema]
    path = write(tmp_path, [good, good, bad])
    records = read_jsonl(path, schema)
    assert next(records) == good  # lines before the bad one are delivered
    with pytest.raises(DataFormatError, match=rf"x\.jsonl:3: .*{message}"):
        list(records)


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"empty\.jsonl: the file has no records"):
        list(read_jsonl(path, "pretrain"))


def test_missing_file_and_unknown_schema(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(read_jsonl(tmp_path / "nope.jsonl", "sft"))
    with pytest.raises(ValueError, match="pretrain, sft, dpo, rl, agent_rl"):
        list(read_jsonl(tmp_path / "nope.jsonl", "chat"))


def test_minimind_data_dir(tmp_path, monkeypatch):
    """MiniMind-3's quick file first, then its full one, then MiniMind2's (legacy, still read)."""
    monkeypatch.setenv("MINIMIND_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="has no sft_t2t_mini.jsonl or sft_t2t.jsonl or "
                                                "sft_mini_512.jsonl.*download data"):
        dataset_files("sft")
    for name in ("sft_mini_512.jsonl", "sft_t2t.jsonl", "sft_t2t_mini.jsonl"):
        (tmp_path / name).write_text('{"conversations": []}\n')
        assert dataset_files("sft") == [tmp_path / name]
    with pytest.raises(FileNotFoundError, match="has no agent_rl.jsonl or agent_rl_math.jsonl"):
        dataset_files("agent_rl")
    monkeypatch.delenv("MINIMIND_DATA_DIR")
    with pytest.raises(FileNotFoundError, match="bundles no rl file.*rlaif.jsonl"):
        dataset_files("rl")


# --- MiniMind-3's current formats (its README, April 2026) -------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "translate_text", "description": "Translate text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"},
                                                    "target_language": {"type": "string"}}}}}]
#: MiniMind's documented tool-use SFT line, with a real tools list where its README has "[...]"
MINIMIND_TOOL_SFT = {"conversations": [
    {"role": "system", "content": "# Tools ...", "tools": json.dumps(TOOLS, ensure_ascii=False)},
    {"role": "user", "content": "把'你好世界'翻译成english"},
    {"role": "assistant", "content": "",
     "tool_calls": "[{\"name\":\"translate_text\",\"arguments\":{\"text\":\"你好世界\","
                   "\"target_language\":\"english\"}}]"},
    {"role": "tool", "content": "{\"translated_text\":\"Hello World\"}"},
    {"role": "assistant", "content": "Hello World"}]}
MINIMIND_LINES = {
    "sft": [{"conversations": [{"role": "user", "content": "你好"},
                               {"role": "assistant", "content": "你好！"},
                               {"role": "user", "content": "再见"},
                               {"role": "assistant", "content": "再见！"}]},
            MINIMIND_TOOL_SFT,
            {"conversations": [  # OpenAI's nesting, arguments as a JSON string, content null
                {"role": "system", "content": "", "tools": TOOLS},
                {"role": "user", "content": "translate 你好"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function", "function": {
                        "name": "translate_text", "arguments": "{\"text\": \"你好\"}"}}]},
                {"role": "tool", "content": "hello"}, {"role": "tool", "content": "hi"},
                {"role": "assistant", "reasoning_content": "two results agree",
                 "content": "hello"}]},
            {"conversations": [{"role": "user", "content": "1+1?"},
                               {"role": "assistant", "content": "<think>\n1+1=2\n</think>\n\n2"}]}],
    "dpo": [{"chosen": [{"content": "Q", "role": "user"},
                        {"content": "good answer", "role": "assistant"}],
             "rejected": [{"content": "Q", "role": "user"},
                          {"content": "bad answer", "role": "assistant"}]}],
    "rl": [{"conversations": [{"role": "user", "content": "请解释一下什么是光合作用？"},
                              {"role": "assistant", "content": "无"}]},
           {"conversations": [{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": ""}]}],
    "agent_rl": [{"conversations": [MINIMIND_TOOL_SFT["conversations"][0],
                                    {"role": "user", "content": "256 * 37 = ?"},
                                    {"role": "assistant", "content": ""}], "gt": ["9472"]},
                 {"conversations": [{"role": "user", "content": "2+2"},
                                    {"role": "assistant", "content": ""}], "gt": [4, "four"]}],
}


@pytest.mark.parametrize("schema", list(MINIMIND_LINES))
def test_minimind_documented_lines_read(tmp_path, schema):
    path = write(tmp_path, MINIMIND_LINES[schema])
    assert list(read_jsonl(path, schema)) == MINIMIND_LINES[schema]


def _tool_line(**change):
    line = json.loads(json.dumps(MINIMIND_TOOL_SFT))
    for index, patch in change.items():
        line["conversations"][int(index[1:])].update(patch)
    return line


@pytest.mark.parametrize(("schema", "bad", "message"), [
    ("sft", _tool_line(m2={"tool_calls": "[{\"name\": \"f\""}),
     r"conversations\[2\]\.tool_calls is a string but not valid JSON"),
    ("sft", _tool_line(m2={"tool_calls": [{"name": "f", "arguments": 3}]}),
     r"conversations\[2\]\.tool_calls\[0\]\.arguments must be an object or a JSON string"),
    ("sft", _tool_line(m2={"tool_calls": [{"function": {"arguments": {}}}]}),
     r"conversations\[2\]\.tool_calls\[0\]\.function\.name must be a non-empty string"),
    ("sft", _tool_line(m0={"tools": "{\"name\": \"f\"}"}),
     r"conversations\[0\]\.tools must be a list of tool objects"),
    ("sft", _tool_line(m3={"content": ["x"]}), r"conversations\[3\]\.content must be a string"),
    ("sft", json.dumps(_tool_line(m4={"reasoning_content": "\ud800"})),  # an escape in JSON
     r"conversations\[4\]\.reasoning_content holds a lone surrogate"),
    ("rl", {"conversations": [{"role": "user", "content": "q"}]}, "no assistant message"),
    ("rl", {"conversations": [{"role": "assistant", "content": ""},
                              {"role": "user", "content": "q"}]},
     "must end with the assistant turn the policy samples"),
    ("rl", {"conversations": [{"role": "assistant", "content": ""}]}, "no prompt before"),
    ("agent_rl", {"conversations": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": ""}]},
     "field 'gt' is missing"),
    ("agent_rl", {"conversations": [{"role": "user", "content": "q"},
                                    {"role": "assistant", "content": ""}], "gt": "9472"},
     "field 'gt' must be a list of strings or numbers"),
])
def test_bad_current_format_lines_name_line_and_field(tmp_path, schema, bad, message):
    good = MINIMIND_LINES[schema][0]
    records = read_jsonl(write(tmp_path, [good, bad]), schema)
    assert next(records) == good
    with pytest.raises(DataFormatError, match=rf"x\.jsonl:2: .*{message}"):
        list(records)


# --- issue 49: input that was accepted without limit, or failed without naming its line ------


def test_a_line_over_the_size_limit_names_its_file_and_line(tmp_path, monkeypatch):
    from minimind_lib.data import readers

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"text": "x" * 5000}) + "\n")
    rows = read_jsonl(path, "pretrain")
    assert next(rows) == {"text": "ok"}
    with pytest.raises(DataFormatError, match=r"big.jsonl:2: the line is longer than 1,000 "):
        next(rows)


def test_an_integer_beyond_pythons_digit_limit_names_its_file_and_line(tmp_path):
    path = tmp_path / "digits.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n" + '{"text": "a", "n": ' + "7" * 5000 + "}\n")
    with pytest.raises(DataFormatError, match=r"digits.jsonl:2: a value JSON cannot be read"):
        list(read_jsonl(path, "pretrain"))


def test_a_huge_message_is_cut_before_it_is_tokenised_and_keeps_the_same_tokens(monkeypatch):
    from minimind_lib.data import conversations
    from minimind_lib.data.conversations import SFTDataset, sft_example, text_budget
    from minimind_lib.tokenizer.bpe import load_tokenizer

    tok = load_tokenizer()
    words = " ".join(f"word{i % 97} 公里 {i}" for i in range(40_000))  # ~0.7 MB, spaced
    chat = [{"role": "user", "content": "Say it all."}, {"role": "assistant", "content": words}]
    assert len(words) > 10 * text_budget(tok, 96)
    cut = sft_example(tok, chat, 96)
    cut_ds = SFTDataset([{"conversations": chat}], tok, seq_len=96, progress=False)[0]
    monkeypatch.setattr(conversations, "text_budget", lambda tokenizer, seq_len: 10**9)
    whole = sft_example(tok, chat, 96)  # tokenised whole, then cut (the old way)
    assert cut == whole and len(cut[0]) == 96
    assert cut_ds["input_ids"].tolist() == whole[0]


@pytest.mark.parametrize("gt, why", [([""], "empty string"), (["  "], "empty string"),
                                     ([float("nan")], "nan"), ([1.0, float("inf")], "inf")])
def test_an_agent_task_whose_answer_check_passes_everything_is_refused(tmp_path, gt, why):
    from minimind_lib.training.agent_rollout import agent_task

    record = {"conversations": [{"role": "user", "content": "2+2?"},
                                {"role": "assistant", "content": ""}], "gt": gt}
    path = tmp_path / "agent.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=why):
        list(read_jsonl(path, "agent_rl"))
    with pytest.raises(DataFormatError, match=why):
        agent_task(record, "agent.jsonl:1")
