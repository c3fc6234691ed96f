"""Pre-tokenised pretraining data: the uint16 stream, the split, the windows, the cache."""

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from minimind_lib.data import DataFormatError
from minimind_lib.data.pretraining import PretrainDataset, load_pretrain_split, tokenize_corpus

DOCS = [f"document {i}: the cat sat on mat number {i * 7}." for i in range(40)]


@pytest.fixture()
def corpus(tmp_path):
    """A jsonl corpus and a small byte-level BPE tokenizer trained on it (eos id 0)."""
    path = tmp_path / "pretrain.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(DOCS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    return path, tmp_path / "tokenizer.json", tok


def split_docs(stream: np.ndarray, eos: int) -> list[list[int]]:
    ends = np.flatnonzero(stream == eos)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [stream[s:e].tolist() for s, e in zip(starts, ends, strict=True)]


def test_stream_is_documents_joined_by_eos(corpus, tmp_path):
    path, tok_path, tok = corpus
    out = tokenize_corpus([path], tok_path, tmp_path / "data", val_fraction=0.1, docs_per_batch=7,
                      progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["eos_id"] == 0
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert train[-1] == 0 and val[-1] == 0
    # every 10th document (9, 19, ...) is validation, whole; the rest train, in order
    expect_val = [d for i, d in enumerate(DOCS) if i % 10 == 9]
    expect_train = [d for i, d in enumerate(DOCS) if i % 10 != 9]
    assert [tok.decode(ids) for ids in split_docs(val, 0)] == expect_val
    assert [tok.decode(ids) for ids in split_docs(train, 0)] == expect_train
    assert meta["splits"]["val"] == {"tokens": len(val), "documents": 4}
    assert meta["splits"]["train"]["documents"] == 36


def test_max_examples_caps_the_documents(corpus, tmp_path):
    path, tok_path, _ = corpus
    out = tokenize_corpus([path], tok_path, tmp_path / "d", max_examples=5, val_fraction=0,
                      progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["documents"] == 5 and meta["splits"]["val"]["tokens"] == 0


def test_second_call_reuses_and_changed_inputs_rebuild(corpus, tmp_path):
    path, tok_path, _ = corpus
    out = tokenize_corpus([path], tok_path, tmp_path / "d", progress=False)
    stamp = (out / "train.bin").stat().st_mtime_ns
    tokenize_corpus([path], tok_path, tmp_path / "d", progress=False)
    assert (out / "train.bin").stat().st_mtime_ns == stamp  # reused
    tokenize_corpus([path], tok_path, tmp_path / "d", max_examples=10, progress=False)
    assert json.loads((out / "meta.json").read_text())["splits"]["train"]["documents"] < 40


def test_a_bad_line_names_file_and_line_and_leaves_no_meta(corpus, tmp_path):
    path, tok_path, _ = corpus
    with path.open("a") as f:
        f.write('{"txt": "oops"}\n')
    with pytest.raises(DataFormatError, match=r"pretrain.jsonl:41: field 'text' is missing"):
        tokenize_corpus([path], tok_path, tmp_path / "d", progress=False)
    assert not (tmp_path / "d" / "meta.json").exists()  # never mistaken for a finished output
    assert not list((tmp_path / "d").glob("*.tmp-*"))  # and no half-written streams left
    with pytest.raises(FileNotFoundError, match="tokenize_corpus did not finish"):
        load_pretrain_split(tmp_path / "d", "train", 8)


def test_windows_overlap_by_one_token_and_cover_the_stream(tmp_path):
    stream = np.arange(1, 24, dtype=np.uint16)  # 23 tokens
    stream.tofile(tmp_path / "train.bin")
    ds = PretrainDataset(tmp_path / "train.bin", seq_len=5)
    assert len(ds) == 4  # (23 - 1) // 5
    windows = [ds[i]["input_ids"] for i in range(len(ds))]
    assert all(w.shape == (6,) and w.dtype == torch.int64 for w in windows)
    assert all(w[-1] == nxt[0] for w, nxt in zip(windows, windows[1:], strict=False))
    targets = torch.cat([w[1:] for w in windows])  # what the shifted loss predicts
    assert targets.tolist() == list(range(2, 22))  # each once, in order
    assert torch.equal(ds[0]["labels"], ds[0]["input_ids"])  # the model shifts the labels


def test_too_short_stream_is_a_clear_error(tmp_path):
    np.arange(4, dtype=np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="do not fill one window of 9"):
        PretrainDataset(tmp_path / "t.bin", seq_len=8)


def test_dataset_pickles_without_the_memmap(tmp_path):
    import pickle
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "t.bin")
    ds = PretrainDataset(tmp_path / "t.bin", seq_len=8)
    _ = ds[0]  # opens the map
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._tokens is None and torch.equal(clone[3]["input_ids"], ds[3]["input_ids"])
