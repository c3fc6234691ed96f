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
    with pytest.raises(ValueError, match="pretrain, sft, dpo"):
        list(read_jsonl(tmp_path / "nope.jsonl", "chat"))


def test_minimind_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIMIND_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="has no sft_mini_512.jsonl"):
        dataset_files("sft")
    (tmp_path / "sft_mini_512.jsonl").write_text('{"conversations": []}\n')
    assert dataset_files("sft") == [tmp_path / "sft_mini_512.jsonl"]
