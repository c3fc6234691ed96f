"""SFT: the answer-only mask contract, the dataset, and SFT end to end in the smoke profile."""

import importlib.util
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minimind_lib import DATA_DIR, REPO_ROOT
from minimind_lib.data import read_jsonl, sft_example
from minimind_lib.data.conversations import SFTDataset, pad_sft_batch
from minimind_lib.model import IGNORE_INDEX
from minimind_lib.tokenizer import apply_chat_template, encode_chat, load_tokenizer

TOK = load_tokenizer()
IM_END = TOK.token_to_id("<|im_end|>")


def supervised_runs(labels):
    """The maximal runs of supervised (non -100) labels, as lists of ids."""
    runs = []
    for supervised, group in itertools.groupby(labels, key=lambda t: t != IGNORE_INDEX):
        if supervised:
            runs.append(list(group))
    return runs


TEMPLATES = ["minimind-3", "minimind2"]  # the course tokenizer's own first; MiniMind2's by name
THINK, THINK_END = TOK.token_to_id("<think>"), TOK.token_to_id("</think>")


def expected_runs(messages, template="minimind-3"):
    """The contract: each assistant turn supervises its content's tokens + <|im_end|>; under
    MiniMind-3's template the empty think block and the "\\n\\n" after it are context, as in the
    thinking-off generation prompt."""
    def encode(text):
        return TOK.encode(text, allowed_special=set())

    def reply(content):  # MiniMind-3's: what follows the empty block's "\n\n", as the prompt's
        if template == "minimind2":
            return encode(content)
        whole, lead = encode("\n\n" + content.lstrip("\n")), encode("\n\n")
        return whole[len(lead):] if whole[:len(lead)] == lead else whole

    return [reply(m["content"]) + [IM_END] for m in messages if m["role"] == "assistant"]


def check_contract(messages, max_length=10_000, template="minimind-3"):
    ids, labels = sft_example(TOK, messages, max_length, template=template)
    assert len(ids) == len(labels) <= max_length
    assert all(lab in (IGNORE_INDEX, i) for i, lab in zip(ids, labels, strict=True))
    return ids, labels


USER = {"role": "user", "content": "Which is larger, 7 or 3?"}
REPLY = {"role": "assistant", "content": "7"}


@pytest.mark.parametrize("template", TEMPLATES)
def test_single_turn_supervises_the_reply_and_its_end_only(template):
    ids, labels = check_contract([USER, REPLY], template=template)
    assert supervised_runs(labels) == expected_runs([USER, REPLY], template)
    assert TOK.decode([t for t in labels if t != IGNORE_INDEX]) == "7<|im_end|>"
    # the ids are the rendered chat (MiniMind2's default system message included)
    assert TOK.decode(ids) == apply_chat_template([USER, REPLY], template=template)
    assert ids == encode_chat(TOK, [USER, REPLY], template=template)
    first_end = ids.index(IM_END)
    assert all(lab == IGNORE_INDEX for lab in labels[:first_end + 1])
    # the course tokenizer speaks MiniMind-3's format by default
    assert sft_example(TOK, [USER, REPLY], 64) == sft_example(TOK, [USER, REPLY], 64,
                                                               template="minimind-3")


@pytest.mark.parametrize("template", TEMPLATES)
def test_multi_turn_supervises_every_assistant_turn(template):
    chat = [USER, REPLY, {"role": "user", "content": "和 9 比呢？"},
            {"role": "assistant", "content": "9 更大。"}, {"role": "user", "content": "ok"},
            {"role": "assistant", "content": "Good: 9 > 7 > 3."}]
    ids, labels = check_contract(chat, template=template)
    assert supervised_runs(labels) == expected_runs(chat, template)
    assert TOK.decode(ids) == apply_chat_template(chat, template=template)
    # the <|im_end|> of user and system turns is never a target; each assistant's one is
    ends = [k for k, i in enumerate(ids) if i == IM_END]
    system = [False] if template == "minimind2" else []  # MiniMind2's default system turn
    assert [labels[k] != IGNORE_INDEX for k in ends] == system + [False, True] * 3


@pytest.mark.parametrize("template", TEMPLATES)
def test_system_message_and_role_markers_are_never_supervised(template):
    system = {"role": "system", "content": "You answer with one number."}
    with_system = check_contract([system, USER, REPLY], template=template)
    without = check_contract([USER, REPLY], template=template)
    for ids, labels in (with_system, without):
        assert supervised_runs(labels) == expected_runs([USER, REPLY], template)
        marked = [lab for i, lab in zip(ids, labels, strict=True)
                  if i == TOK.token_to_id("<|im_start|>")]
        assert marked and all(lab == IGNORE_INDEX for lab in marked)
    assert TOK.decode(with_system[0]).startswith("<|im_start|>system\nYou answer with one number.")


@pytest.mark.parametrize("template", TEMPLATES)
def test_typed_special_tokens_in_content_are_text(template):
    chat = [{"role": "user", "content": "say <|im_end|> <think>"},
            {"role": "assistant", "content": "<|im_end|><|im_start|>user <tool_call>"}]
    ids, labels = check_contract(chat, template=template)
    assert supervised_runs(labels) == expected_runs(chat, template)
    # user and assistant turns (+ MiniMind2's system turn): the typed ones are text
    assert ids.count(IM_END) == (2 if template == "minimind-3" else 3)
    assert ids.count(THINK) == (1 if template == "minimind-3" else 0)
    assert THINK not in [lab for lab in labels if lab != IGNORE_INDEX]  # empty: not a target
    assert TOK.token_to_id("<tool_call>") not in ids


def test_truncation_keeps_a_prefix_of_ids_and_labels():
    chat = [USER, {"role": "assistant", "content": "The larger number is seven, 7."}]
    full_ids, full_labels = check_contract(chat)
    first = next(k for k, lab in enumerate(full_labels) if lab != IGNORE_INDEX)
    for cut in (first, first + 1, first + 3, len(full_ids) - 1, len(full_ids)):
        ids, labels = check_contract(chat, cut)
        assert (ids, labels) == (full_ids[:cut], full_labels[:cut])
    assert all(lab == IGNORE_INDEX for lab in sft_example(TOK, chat, first)[1])


text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                 "content": st.one_of(text, st.sampled_from(
                                     ["<|im_end|>", "\n\nhi", " 你好", "assistant\n", ""]))})


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(message, min_size=1, max_size=6),
       system=st.one_of(st.none(), text), max_length=st.integers(1, 80),
       template=st.sampled_from(TEMPLATES))
def test_mask_contract_on_random_conversations(messages, system, max_length, template):
    chat = ([{"role": "system", "content": system}] if system is not None else []) + messages
    ids, labels = check_contract(chat, template=template)
    assert TOK.decode(ids) == apply_chat_template(chat, template=template)
    assert supervised_runs(labels) == expected_runs(chat, template)
    assert check_contract(chat, max_length, template) == (ids[:max_length], labels[:max_length])


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.one_of(text, st.just("a<|im_start|>b<|endoftext|>")), max_size=5))
def test_fast_batch_encoding_equals_the_python_tokenizer(texts):
    assert (TOK.encode_batch(texts, allowed_special=set())
            == [TOK.encode(t, allowed_special=set()) for t in texts])


def chat_of(user: str, reply: str) -> dict:
    return {"conversations": [{"role": "user", "content": user},
                              {"role": "assistant", "content": reply}]}


def test_dataset_skips_and_counts_examples_without_supervised_tokens():
    long_question = chat_of("why? " * 60, "because")
    records = [chat_of("1 + 1?", "2"), long_question, chat_of("hi", "hello"), long_question]
    ds = SFTDataset(records, TOK, seq_len=48, progress=False)
    assert (len(ds), ds.skipped) == (2, 2)
    for k, record in enumerate([records[0], records[2]]):
        ids, labels = sft_example(TOK, record["conversations"], 48)
        assert ds[k]["input_ids"].tolist() == ids and ds[k]["labels"].tolist() == labels
        assert (ds[k]["labels"] != IGNORE_INDEX).any()
    with pytest.raises(ValueError, match="no SFT example has a supervised token"):
        SFTDataset([long_question], TOK, seq_len=48, progress=False)


def test_dataset_equals_sft_example_on_bundled_data_and_pads_with_ignore():
    records = list(itertools.islice(read_jsonl(DATA_DIR / "sft_sample.jsonl", "sft"), 300))
    ds = SFTDataset(records, TOK, seq_len=64, chunk_size=128, progress=False)
    assert len(ds) + ds.skipped == len(records)
    assert ds.skipped == sum(all(lab == IGNORE_INDEX
                                 for lab in sft_example(TOK, r["conversations"], 64)[1])
                             for r in records)
    kept = [r for r in records if any(lab != IGNORE_INDEX for lab in
                                      sft_example(TOK, r["conversations"], 64)[1])]
    for k in range(0, len(ds), 37):
        ids, labels = sft_example(TOK, kept[k]["conversations"], 64)
        assert ds[k]["input_ids"].tolist() == ids and ds[k]["labels"].tolist() == labels
    batch = ds.collate([ds[k] for k in range(8)])
    lengths = [len(ds[k]["input_ids"]) for k in range(8)]
    assert batch["input_ids"].shape == (8, max(lengths))
    for row, n in enumerate(lengths):
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
        assert (batch["input_ids"][row, n:] == TOK.token_to_id("<|endoftext|>")).all()
        assert torch.equal(batch["input_ids"][row, :n], ds[row]["input_ids"])
    all_tokens = SFTDataset(records, TOK, seq_len=64, answer_only=False, progress=False)
    assert len(all_tokens) == len(ds)  # the same examples, only the labels differ
    assert torch.equal(all_tokens[3]["labels"], all_tokens[3]["input_ids"])


def test_padded_batch_gives_each_row_its_unpadded_loss():
    """Right padding with -100 labels must not change a row's loss (causal attention)."""
    from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM

    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(hidden_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1))
    short = {"input_ids": torch.tensor([1, 40, 41, 42]),
             "labels": torch.tensor([-100, -100, 41, 42])}
    long = {"input_ids": torch.tensor([1, 50, 51, 52, 53, 54]),
            "labels": torch.tensor([-100, -100, -100, 52, 53, 54])}
    batch = pad_sft_batch([short, long], pad_id=0)
    logits = model(batch["input_ids"]).logits  # (2, 6, V)
    alone = model(short["input_ids"][None]).logits  # (1, 4, V)
    # fp32, same kernels, only extra masked-out keys: agreement to float rounding
    torch.testing.assert_close(logits[0, :4], alone[0], rtol=1e-5, atol=1e-5)


# --- end to end in the smoke profile -------------------------------------------------------


def test_sft_stage_writes_a_model_metrics_and_before_after_eval(smoke_runs):
    from minimind_lib.course.plotting import read_metrics
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stages import read_marker
    from minimind_lib.evaluation.model_eval import read_eval
    from minimind_lib.evaluation.questions import summarize
    from minimind_lib.model.checkpoint import load_model

    profile, out = get_profile("smoke"), smoke_runs / "sft"
    assert load_model(out).config == profile.model
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, profile.sft.max_steps + 1))
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == profile.sft.max_steps // profile.sft.eval_every and val[-1] < val[0]
    summary = read_marker(out)["summary"]
    assert summary["examples"] + summary["skipped"] == profile.sft.max_examples
    evals = read_eval(out)
    assert set(evals) == {"pretrain", "sft"}
    for e in evals.values():
        assert len(e.tasks) == 12 and all(t.n == profile.eval_per_task for t in e.tasks.values())
        assert math.isfinite(e.perplexity)
    before, after = summarize(evals["pretrain"].tasks)["all"], summarize(evals["sft"].tasks)["all"]
    # the pretrained model has never seen <|im_end|>; 80 SFT steps teach the turn's shape
    assert before.format_rate == 0.0 and after.format_rate > 0.3, (before, after)


def test_sft_raises_exact_match_on_a_task_the_tiny_model_can_learn(smoke_runs, tmp_path):
    """first_word in the smoke profile: the ~0.5M-parameter model cannot copy a word yet, but
    it learns the reply's shape and answers with one common first word ("It" here, 4 of the
    120 references), so exact-match leaves zero (measured 0% -> 3.3%, format 0% -> 100%).
    fp32, so the result does not depend on whether this CPU has native bf16."""
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.evaluation.questions import evaluate_sft, load_eval_records
    from minimind_lib.model.checkpoint import load_model
    from minimind_lib.training.sft import train_sft

    train_file = tmp_path / "first_word.jsonl"
    lines = (DATA_DIR / "sft_sample.jsonl").read_text(encoding="utf-8").splitlines()
    train_file.write_text("\n".join(x for x in lines if '"task":"first_word"' in x) + "\n")
    questions = [r for r in load_eval_records() if r["task"] == "first_word"]
    model = load_model(smoke_runs / "pretrain")
    before = evaluate_sft(model, TOK, questions, progress=False)["first_word"]
    train_sft(model, TOK, get_profile("smoke").sft, seed=0, files=[train_file], precision="fp32",
              progress=False)
    after = evaluate_sft(model, TOK, questions, progress=False)["first_word"]
    assert before.exact_match == 0.0 and before.format_rate == 0.0
    assert after.exact_match > 0.0 and after.format_rate > 0.9, after


# --- replay: pretraining text beside the conversations (against forgetting) ------------------


@pytest.mark.parametrize("share", [0.2, 0.5, 0.8])
def test_replay_mix_gives_text_its_share_of_the_supervised_tokens(tmp_path, share):
    import numpy as np

    from minimind_lib.data.pretraining import PretrainDataset
    from minimind_lib.training.sft import ReplayMix

    path = tmp_path / "train.bin"
    np.arange(5000, dtype=np.uint16).tofile(path)
    records = list(itertools.islice(read_jsonl(DATA_DIR / "sft_sample.jsonl", "sft"), 200))
    sft = SFTDataset(records, TOK, 128, progress=False)
    mix = ReplayMix(sft, PretrainDataset(path, seq_len=31), share, seed=0)
    rows = [mix[i] for i in range(len(mix))]
    supervised = [int((r["labels"] != IGNORE_INDEX).sum()) for r in rows]
    text = sum(supervised[len(sft):])
    assert text == mix.windows * 32 and sum(supervised[:len(sft)]) == sft.num_targets
    assert abs(text / sum(supervised) - share) < 32 / sum(supervised)  # within one window
    windows = [tuple(r["input_ids"].tolist()) for r in rows[len(sft):]]
    assert len(set(windows)) == min(len(windows), 5000 // 31)  # no repeats while text lasts
    some = rows[len(sft) - 2:len(sft) + 2]  # two conversations, two windows, padded together
    batch = mix.collate(some)
    width = max(len(r["input_ids"]) for r in some)
    assert batch["input_ids"].shape == batch["labels"].shape == (4, width)


def test_sft_stage_replays_pretraining_text(tmp_path, capsys):
    from minimind_lib.__main__ import main
    from minimind_lib.course.stages import read_marker

    assert main(["sft", "--profile", "smoke", "--out", str(tmp_path), "--set", "sft.replay=0.5",
                 "--set", "sft.replay_window=32", "--set", "sft.max_steps=3",
                 "--set", "pretrain.max_steps=3", "--set", "eval_per_task=2"]) == 0
    assert " windows of 32 tokens of pretraining text replayed" in capsys.readouterr().out
    marker = read_marker(tmp_path / "sft")
    assert marker["fingerprint"]["settings"]["replay"] == 0.5
    assert any("pretrain_sample" in f for f in marker["fingerprint"]["data"])
    assert (tmp_path / "sft" / "replay_data" / "train.bin").is_file()
    # the forgetting sweep's table row reads what the stage wrote (benchmarks/forgetting_sweep.py)
    spec = importlib.util.spec_from_file_location(
        "forgetting_sweep", REPO_ROOT / "benchmarks" / "forgetting_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    sweep.VARIANTS["sft"][tmp_path.name] = ["sft.replay=0.5"]  # the run's folder is the variant's
    cells = sweep.row("sft", tmp_path.name, tmp_path.parent).split("|")
    assert len(cells) - 2 == sweep.header("sft").splitlines()[0].count("|") - 1
    assert cells[2].strip() == "sft.replay=0.5" and "x)" in cells[3]
    with pytest.raises(ValueError, match=r"replay must be in \[0, 1\)"):
        from minimind_lib.course.profiles import get_profile, override
        override(get_profile("smoke"), {"sft.replay": "1"})
    with pytest.raises(ValueError, match=r"replay_window must be in \[2, seq_len="):
        override(get_profile("smoke"), {"sft.replay_window": "100000"})
