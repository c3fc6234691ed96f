"""DPO: the loss against its formula, ln 2 at the start, masks, the frozen reference, the stage."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from tiny import tiny_model

import minimind_lib.training.on_policy as on_policy_module
from minimind_lib.course.profiles import get_profile
from minimind_lib.course.stage_data import training_questions
from minimind_lib.course.stages import STAGES, StageContext
from minimind_lib.data import sft_example
from minimind_lib.evaluation.preferences import summarize_preferences
from minimind_lib.evaluation.questions import Answer
from minimind_lib.model import IGNORE_INDEX, MiniMindForCausalLM
from minimind_lib.model.checkpoint import save_model
from minimind_lib.tokenizer import IM_END, encode_chat, load_tokenizer
from minimind_lib.training import TrainConfig, train
from minimind_lib.training.dpo import (
    DPODataset,
    DPOLoss,
    collate_pairs,
    dpo_loss,
    pair_logprobs,
    read_dpo_eval,
    reservoir_sample,
    train_dpo,
)
from minimind_lib.training.logprobs import answer_logprobs, frozen_copy, sequence_logprobs
from minimind_lib.training.on_policy import on_policy_pairs, pick_pair
from minimind_lib.training.rollout import Question, Sample, is_correct, reply
from minimind_lib.training.sft import train_sft

TOK = load_tokenizer()


def pair(question: str, good: str, bad: str, task: str = "t") -> dict:
    user = {"role": "user", "content": question}
    return {"chosen": [user, {"role": "assistant", "content": good}],
            "rejected": [user, {"role": "assistant", "content": bad}], "task": task,
            "family": "skill"}


PAIRS = [pair(f"{a} 和 {b} 哪个大？", str(max(a, b)), str(min(a, b)) * (1 + a % 2))
         for a, b in [(3, 7), (9, 2), (12, 5), (4, 40), (8, 1), (6, 60), (15, 16), (2, 22)]]


# --- the loss ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("beta", [0.01, 0.1, 0.5, 2.0])
def test_dpo_loss_equals_the_formula(seed, beta):
    g = torch.Generator().manual_seed(seed)
    pc, pr, rc, rr = (-50 * torch.rand(16, generator=g, dtype=torch.float64) for _ in range(4))
    loss, chosen, rejected = dpo_loss(pc.float(), pr.float(), rc.float(), rr.float(), beta)
    # eq. 7 written out in float64, with the plain sigmoid: -log sigma(beta * (log-ratio diff))
    z = beta * ((pc - rc) - (pr - rr))
    expected = -torch.log(1 / (1 + torch.exp(-z))).mean()
    # float32 inputs of magnitude <= 50: log-ratios carry ~1e-5 absolute rounding error
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5 * max(beta, 1))
    torch.testing.assert_close(chosen.double(), beta * (pc - rc), rtol=0, atol=1e-5 * max(beta, 1))
    torch.testing.assert_close(rejected.double(), beta * (pr - rr), rtol=0,
                               atol=1e-5 * max(beta, 1))
    assert not chosen.requires_grad and not rejected.requires_grad


def test_dpo_loss_is_stable_for_large_margins():
    loss, _, _ = dpo_loss(torch.tensor([0.0]), torch.tensor([-1e4]), torch.tensor([0.0]),
                          torch.tensor([0.0]), beta=1.0)
    assert loss.item() == 0.0  # log sigmoid(1e4): no log(0) = inf
    loss, _, _ = dpo_loss(torch.tensor([-1e4]), torch.tensor([0.0]), torch.tensor([0.0]),
                          torch.tensor([0.0]), beta=1.0)
    assert loss.item() == pytest.approx(1e4)  # -log sigmoid(-1e4) = 1e4, finite
    with pytest.raises(ValueError, match="beta must be positive"):
        dpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), beta=0.0)


def test_answer_logprobs_counts_only_supervised_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    labels = torch.tensor([[-100, -100, -100, 4, 5, -100], [-100, 7, 1, 2, -100, -100]])
    logp = logits.log_softmax(-1)
    expected = torch.stack([logp[0, 2, 4] + logp[0, 3, 5],
                            logp[1, 0, 7] + logp[1, 1, 1] + logp[1, 2, 2]])
    torch.testing.assert_close(answer_logprobs(logits, labels), expected)
    torch.testing.assert_close(answer_logprobs(logits, labels, average=True),
                               expected / torch.tensor([2.0, 3.0]))
    # the logits at positions scoring prompt or padding tokens do not matter at all
    noisy = logits.clone()
    noisy[0, [0, 1, 4, 5]] += 100 * torch.randn(4, 11)
    noisy[1, [3, 4, 5]] += 100 * torch.randn(3, 11)
    assert torch.equal(answer_logprobs(noisy, labels), answer_logprobs(logits, labels))
    with pytest.raises(ValueError, match="row 1 has no supervised token"):
        answer_logprobs(logits, torch.tensor([[-100, 1, 2, 3, 4, 5], [-100] * 6]))


THINK_BLOCK = "<think>\n\n</think>\n\n"  # opens every reply in the course's format: context


# --- the data ------------------------------------------------------------------------------


def test_dataset_masks_exclude_the_prompt():
    ds = DPODataset(PAIRS[:2], TOK, seq_len=64)
    item = ds[0]
    for side, answer in (("chosen", "7"), ("rejected", "33")):
        ids, labels = item[f"{side}_input_ids"], item[f"{side}_labels"]
        supervised = labels != IGNORE_INDEX
        # supervised ids are exactly the answer content and its <|im_end|>, at the end (the
        # empty think block before them is context, as in the generation prompt)
        assert TOK.decode(ids[supervised].tolist()) == answer + "<|im_end|>"
        assert torch.equal(labels[supervised], ids[supervised])
        first = int(supervised.nonzero()[0, 0])
        assert not supervised[:first].any() and supervised[first:].sum() == len(ids[first:]) - 1
        assert TOK.decode(ids[:first].tolist()).endswith("<|im_start|>assistant\n" + THINK_BLOCK)
    # chosen and rejected share the prompt token for token
    c_first = int((item["chosen_labels"] != IGNORE_INDEX).nonzero()[0, 0])
    assert torch.equal(item["chosen_input_ids"][:c_first], item["rejected_input_ids"][:c_first])
    assert ds.tasks == ["t", "t"] and ds.families == ["skill", "skill"]


def test_dataset_rejects_different_prompts_and_drops_cut_answers():
    bad = pair("1 和 2 哪个大？", "2", "1")
    bad["rejected"][0] = {"role": "user", "content": "another question"}
    with pytest.raises(ValueError, match="record 2: 'chosen' and 'rejected' must share the prompt"):
        DPODataset([PAIRS[0], bad], TOK, seq_len=64)
    long_prompt = pair("很长的问题" * 40, "2", "1")
    ds = DPODataset([PAIRS[0], long_prompt], TOK, seq_len=48)
    assert len(ds) == 1 and ds.dropped == 1
    with pytest.raises(ValueError, match="no usable preference pair"):
        DPODataset([long_prompt], TOK, seq_len=48)


def test_reservoir_sample_is_uniform_and_keeps_stream_order():
    counts = torch.zeros(10)
    for seed in range(3000):
        kept = reservoir_sample(range(10), 3, seed)
        assert len(kept) == 3 and kept == sorted(kept)
        counts[kept] += 1
    # each item is kept with probability 3/10: 900 of 3000 draws, binomial sd ~25; allow 5 sd
    assert (counts - 900).abs().max() < 125, counts
    assert reservoir_sample(range(4), 9, seed=0) == [0, 1, 2, 3]


def test_collate_stacks_chosen_then_rejected_with_reference_logps():
    ds = DPODataset(PAIRS[:3], TOK, seq_len=64)
    ds.set_reference(torch.tensor([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]]))
    batch = ds.collate([ds[0], ds[2]])
    assert batch["input_ids"].shape[0] == 4
    assert torch.equal(batch["input_ids"][1, :len(ds[2]["chosen_input_ids"])],
                       ds[2]["chosen_input_ids"])
    assert torch.equal(batch["input_ids"][2, :len(ds[0]["rejected_input_ids"])],
                       ds[0]["rejected_input_ids"])
    assert batch["ref_logps"].tolist() == [-1.0, -5.0, -2.0, -6.0]
    with pytest.raises(ValueError, match="shape"):
        ds.set_reference(torch.zeros(2, 2))


def test_sequence_logprobs_head_on_answers_only_equals_full_logits():
    model, ds = tiny_model(), DPODataset(PAIRS, TOK, seq_len=64)
    batch = ds.collate([ds[i] for i in range(len(ds))])
    fast = sequence_logprobs(model, batch["input_ids"], batch["labels"])
    full = answer_logprobs(model(batch["input_ids"]).logits, batch["labels"])
    # the same fp32 matmuls on fewer rows: agreement to float32 rounding of ~20-term sums
    torch.testing.assert_close(fast, full, rtol=1e-6, atol=1e-5)
    fast.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_pair_logprobs_do_not_depend_on_batching():
    model, ds = tiny_model(), DPODataset(PAIRS, TOK, seq_len=64)
    one = pair_logprobs(model, ds, batch_size=1, device="cpu", precision="fp32")
    many = pair_logprobs(model, ds, batch_size=5, device="cpu", precision="fp32")
    # right padding never reaches real tokens (causal attention); fp32 sums of ~10 log-probs
    # computed with different matmul shapes agree to well within 1e-4
    torch.testing.assert_close(one, many, rtol=0, atol=1e-4)
    direct = sequence_logprobs(model, *(collate_pairs([ds[3]])[k] for k in ("input_ids", "labels")))
    torch.testing.assert_close(one[3], direct, rtol=0, atol=1e-5)


# --- the reference ---------------------------------------------------------------------------


def test_loss_is_ln2_and_rewards_zero_when_policy_equals_reference():
    policy, ds = tiny_model(), DPODataset(PAIRS, TOK, seq_len=64)
    batch = ds.collate([ds[i] for i in range(len(ds))])
    loss, metrics = DPOLoss(beta=0.1, reference=frozen_copy(policy))(policy, batch)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-7)
    assert torch.equal(metrics["chosen_reward"], torch.tensor(0.0))
    assert torch.equal(metrics["rejected_reward"], torch.tensor(0.0))
    # the same with reference log-probs precomputed by the policy itself
    ds.set_reference(pair_logprobs(policy, ds, device="cpu", precision="fp32"))
    loss2, _ = DPOLoss(beta=0.1)(policy, ds.collate([ds[i] for i in range(len(ds))]))
    assert loss2.item() == pytest.approx(math.log(2), abs=1e-6)
    with pytest.raises(ValueError, match="needs a reference model"):
        DPOLoss(beta=0.1)(policy, batch)


def test_gradients_reach_the_policy_only_and_training_leaves_the_reference_unchanged():
    policy, ds = tiny_model(), DPODataset(PAIRS, TOK, seq_len=64)
    reference = frozen_copy(policy)
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    loss, _ = DPOLoss(beta=0.1, reference=reference)(policy, ds.collate([ds[0], ds[1]]))
    loss.backward()
    assert all(p.grad is not None for p in policy.parameters())
    assert any(p.grad.abs().sum() > 0 for p in policy.parameters())
    assert all(p.grad is None for p in reference.parameters())
    policy.zero_grad(set_to_none=True)

    before = {k: v.clone() for k, v in reference.state_dict().items()}
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    config = TrainConfig(batch_size=4, max_steps=3, warmup_steps=0, learning_rate=1e-2,
                         precision="fp32", device="cpu", progress=False)
    rows = train(policy, ds, config, loss_fn=DPOLoss(beta=0.1, reference=reference),
                 collate_fn=ds.collate)
    assert all(torch.equal(before[k], v) for k, v in reference.state_dict().items())
    assert any(not torch.equal(start[k], v) for k, v in policy.state_dict().items())
    assert {"reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward"} <= set(rows[0])
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # first step: policy == ref


def test_train_dpo_live_and_precomputed_reference_agree():
    # the two ways of getting reference log-probs give the same training run: bit-identical
    # inputs, so fp32 results may differ only by summation-order rounding (1e-5)
    runs = []
    for precompute in (True, False):
        policy, ds = tiny_model(), DPODataset(PAIRS, TOK, seq_len=64)
        config = TrainConfig(batch_size=4, max_steps=4, warmup_steps=0, learning_rate=1e-2,
                             precision="fp32", device="cpu", progress=False)
        runs.append(train_dpo(policy, ds, config, precompute_reference=precompute))
    for a, b in zip(*runs, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["reward_margin"] == pytest.approx(b["reward_margin"], abs=1e-5)


# --- on-policy pairs ---------------------------------------------------------------------------


def test_pick_pair_rejects_the_first_wrong_and_chooses_the_first_right():
    assert pick_pair([False, False, True, True]) == (2, 0)  # greedy wrong: it is the rejected
    assert pick_pair([True, True, False]) == (0, 2)
    assert pick_pair([False, False]) == (None, 0)  # nobody right: the reference is chosen
    assert pick_pair([True, True, True]) is None  # nothing to prefer


def test_dpo_loss_with_nll_adds_the_chosen_answers_per_token_nll():
    policy, ds = tiny_model(), DPODataset(PAIRS, TOK, seq_len=64)
    batch = ds.collate([ds[i] for i in range(4)])
    reference = frozen_copy(tiny_model(seed=1))  # another model: rewards are not 0
    plain, _ = DPOLoss(0.1, reference)(policy, batch)
    mixed, metrics = DPOLoss(0.1, reference, nll_weight=0.5)(policy, batch)
    logps = sequence_logprobs(policy, batch["input_ids"], batch["labels"])[:4]
    tokens = (batch["labels"][:4, 1:] != IGNORE_INDEX).sum(dim=1)  # answer + <|im_end|>
    nll = -(logps / tokens).mean()
    assert metrics["nll"].item() == pytest.approx(nll.item(), abs=1e-6)
    assert mixed.item() == pytest.approx(plain.item() + 0.5 * nll.item(), abs=1e-6)
    with pytest.raises(ValueError, match="nll_weight and replay_weight must be >= 0"):
        DPOLoss(0.1, nll_weight=-1.0)


QUESTIONS = [Question(p["chosen"][:-1], p["chosen"][-1]["content"], "larger_number", "skill")
             for p in PAIRS[:4]]


def _scripted(texts_per_question: list[list[str]]):
    """A stand-in for ``sample_answers`` that 'samples' the given replies, in order: first the
    greedy call (k=1), then the sampled one (k-1)."""
    def fake(model, tokenizer, questions, k, **kw):
        start = 0 if k == 1 else 1
        out = []
        for q, texts in zip(questions, texts_per_question, strict=True):
            prompt = encode_chat(TOK, q.messages, add_generation_prompt=True)
            out.append([Sample(prompt, TOK.encode(t) + [TOK.token_to_id(IM_END)], Answer(t, True))
                        for t in texts[start:start + k]])
        return out
    return fake


def test_on_policy_pairs_pair_graded_answers_token_for_token(monkeypatch):
    # question 0: greedy wrong, a sample right; 1: every answer right; 2: nobody right;
    # 3: greedy right, one sample wrong
    texts = [["3", "7", "3"], ["9", "9", "9"], ["5", "2", "1"], ["40", "4", "40"]]
    monkeypatch.setattr(on_policy_module, "sample_answers", _scripted(texts))
    ds, counts = on_policy_pairs(tiny_model(), TOK, QUESTIONS, samples=3, temperature=1.0,
                                 max_new_tokens=8, seq_len=64)
    answer = [TOK.decode([t for t in ds[i][f"{side}_labels"].tolist() if t != IGNORE_INDEX])
              for i in range(len(ds)) for side in ("chosen", "rejected")]
    assert answer == ["7<|im_end|>", "3<|im_end|>", "12<|im_end|>", "5<|im_end|>",
                      "40<|im_end|>", "4<|im_end|>"]
    c = counts["all"]
    assert (c.questions, c.pairs, c.all_right, c.sampled_chosen, c.reference_chosen,
            c.greedy_right) == (4, 3, 1, 2, 1, 2)
    # the reference chosen is tokenised exactly as SFT tokenises that answer; its targets are
    # what follows the generation prompt (which holds the empty think block SFT supervises)
    ids, labels = sft_example(TOK, PAIRS[2]["chosen"], 64)
    chosen = ds[1]["chosen_input_ids"].tolist()
    assert chosen == ids[:len(chosen)]
    start = len(encode_chat(TOK, PAIRS[2]["chosen"][:-1], add_generation_prompt=True))
    assert ds[1]["chosen_labels"].tolist() == [IGNORE_INDEX] * start + labels[start:len(chosen)]


def test_more_pairs_per_question_use_further_different_wrong_answers(monkeypatch):
    texts = [["3", "7", "3"], ["9", "9", "9"], ["5", "2", "1"], ["40", "4", "40"]]
    monkeypatch.setattr(on_policy_module, "sample_answers", _scripted(texts))
    ds, counts = on_policy_pairs(tiny_model(), TOK, QUESTIONS, samples=3, temperature=1.0,
                                 max_new_tokens=8, seq_len=64, pairs_per_question=2)
    answer = [TOK.decode([t for t in ds[i][f"{side}_labels"].tolist() if t != IGNORE_INDEX])
              for i in range(len(ds)) for side in ("chosen", "rejected")]
    # question 0: "3" twice is one wrong answer; question 2: the reference against "5" and "2"
    assert answer == ["7<|im_end|>", "3<|im_end|>", "12<|im_end|>", "5<|im_end|>",
                      "12<|im_end|>", "2<|im_end|>", "40<|im_end|>", "4<|im_end|>"]
    assert counts["all"].pairs == 4 and counts["all"].reference_chosen == 2


def test_on_policy_pairs_from_a_real_model_reject_only_wrong_answers():
    ds, counts = on_policy_pairs(tiny_model(), TOK, QUESTIONS, samples=3, temperature=1.0,
                                 max_new_tokens=6, seq_len=64,
                                 generator=torch.Generator().manual_seed(0))
    # an untrained model never answers right: every pair is reference vs its own answer
    assert counts["all"].pairs == len(ds) == 4 and counts["all"].reference_chosen == 4
    for i, q in enumerate(QUESTIONS):
        chosen = TOK.decode([t for t in ds[i]["chosen_labels"].tolist() if t != IGNORE_INDEX])
        rejected = ds[i]["rejected_labels"][ds[i]["rejected_labels"] != IGNORE_INDEX].tolist()
        assert chosen == q.answer + "<|im_end|>"
        assert not is_correct(reply(TOK, rejected)[1], q.answer)
        assert 1 <= len(rejected) <= 6


# --- end to end: the smoke profile ------------------------------------------------------------


def test_dpo_stage_raises_heldout_preference_accuracy_in_the_smoke_profile(tmp_path, capsys):
    """The ``dpo`` stage on a smoke-profile SFT model: held-out preference accuracy of the DPO
    model (by log-prob) rises above the SFT model's, and its implicit rewards prefer the chosen
    answers of unseen pairs more often than not."""
    smoke = get_profile("smoke")
    # pinned: the DPO settings this test was validated with (lr 1e-3, 120 steps, now also the
    # smoke profile's: log-prob accuracy +0.9 to +1.2 points with seeds 42, 1, 2, i.e. 11-14
    # more pairs right; the earlier 5e-4 x 30 steps moved it by -0.8 to -0.4), on every
    # held-out pair (100 per task) so the rise is counted in pairs, not in the noise of 20
    profile = replace(smoke, eval_per_task=100,
                      dpo=replace(smoke.dpo, learning_rate=1e-3, max_steps=120, pairs="offline",
                                  nll_weight=1.0, replay_weight=0.0))
    (tmp_path / "tokenizer").mkdir()
    TOK.save(tmp_path / "tokenizer" / "tokenizer.json")
    torch.manual_seed(profile.seed)
    sft = MiniMindForCausalLM(profile.model)
    train_sft(sft, TOK, profile.sft, seed=profile.seed, precision="fp32", device="cpu",
              progress=False)
    save_model(sft, tmp_path / "sft")

    ctx = StageContext("dpo", profile, tmp_path, device="cpu", precision="fp32",
                                progress=False)
    ctx.out_dir.mkdir()
    summary = STAGES["dpo"].run(ctx)
    acc = summary["preference_accuracy"]
    assert acc["dpo_logprob"] > acc["sft_logprob"], acc
    assert acc["dpo_reward"] > 0.5, acc
    assert ((ctx.out_dir / "model.safetensors").is_file()
            and (ctx.out_dir / "metrics.jsonl").is_file())
    prefs, evals = read_dpo_eval(ctx.out_dir)
    assert set(evals) == {"sft", "dpo"}
    assert summarize_preferences(prefs.dpo)["all"].n == 1200
    assert "reward acc. DPO" in capsys.readouterr().out


def test_dpo_stage_on_policy_pairs_the_models_own_answers(tmp_path, capsys):
    """The default (on-policy) dpo stage: it samples and grades, writes the pair counts into
    eval.json, and trains on those pairs with the NLL term logged."""
    smoke = get_profile("smoke")
    assert smoke.dpo.pairs == "on_policy"
    profile = replace(smoke, eval_per_task=2,
                      dpo=replace(smoke.dpo, questions=24, val_questions=8, max_steps=3,
                                  warmup_steps=1, eval_every=3, save_every=3, nll_weight=1.0,
                                  replay_weight=0.5, replay_window=32))
    (tmp_path / "tokenizer").mkdir()
    TOK.save(tmp_path / "tokenizer" / "tokenizer.json")
    save_model(tiny_model(), tmp_path / "sft")
    ctx = StageContext("dpo", profile, tmp_path, device="cpu", precision="fp32", progress=False)
    ctx.out_dir.mkdir()
    summary = STAGES["dpo"].run(ctx)
    assert summary["pair_source"] == "on_policy" and summary["steps"] == 3
    saved = json.loads((ctx.out_dir / "eval.json").read_text())
    counts = saved["pair_counts"]["all"]
    assert counts["questions"] == 24 and counts["pairs"] == summary["pairs"]
    assert counts["pairs"] + counts["all_right"] + counts["too_long"] == 24
    rows = [json.loads(line) for line in (ctx.out_dir / "metrics.jsonl").open()]
    assert all("nll" in r and "text_nll" in r for r in rows)  # replayed pretraining text
    assert (ctx.out_dir / "replay_data" / "train.bin").is_file()
    # validation: the untrained model answers every held-out question wrong, so each of the 8
    # gives a pair; the offline pairs' loss is logged beside it, and the two differ
    assert summary["val_pairs"] == 8
    last = rows[-1]
    assert {"val_loss", "offline_val_loss"} <= set(last)
    assert last["val_loss"] != last["offline_val_loss"]
    assert summary["final_offline_val_loss"] == last["offline_val_loss"]
    out = capsys.readouterr().out
    assert "on-policy pairs" in out and "8 on-policy pairs from 8 held-out" in out


def test_dpo_validation_questions_are_none_of_the_training_questions():
    """``training_questions``' held-out sample: seeded, of the same tasks, no prompt shared with
    the training sample; the training sample is the same with or without it."""
    profile = get_profile("smoke")
    train, val = training_questions(profile, "skill", 50, "dpo", held_out=20)
    assert len(train) == 50 and len(val) == 20
    prompts = {json.dumps(q.messages, ensure_ascii=False) for q in train}
    assert not any(json.dumps(q.messages, ensure_ascii=False) in prompts for q in val)
    assert {q.family for q in val} == {"skill"}
    again, none = training_questions(profile, "skill", 50, "dpo")
    assert again == train and none == []
    assert training_questions(profile, "skill", 50, "dpo", held_out=20)[1] == val


def test_dpo_loss_adds_the_replayed_texts_next_token_loss(tmp_path):
    """``replay_weight``: the loss of a batch with ``text_ids`` is the pairs' loss plus that
    weight times the model's next-token loss on the text; validation batches carry no text."""
    import numpy as np

    from minimind_lib.data.pretraining import PretrainDataset
    from minimind_lib.training.dpo import PairsWithText

    path = tmp_path / "train.bin"
    np.arange(3, 400, dtype=np.uint16).tofile(path)
    model = tiny_model()
    pairs = DPODataset(PAIRS[:6], TOK, 64)
    pairs.set_reference(pair_logprobs(model, pairs, device="cpu", precision="fp32"))
    data = PairsWithText(pairs, PretrainDataset(path, seq_len=15), seed=0)
    batch = data.collate([data[i] for i in range(4)])
    assert batch["text_ids"].shape == (4, 16)
    windows = {tuple(data[i]["text_ids"].tolist()) for i in range(len(data))}
    assert len(windows) == 6  # drawn without repetition while the text lasts
    plain, _ = DPOLoss(0.1, nll_weight=1.0)(model, batch)
    loss, metrics = DPOLoss(0.1, nll_weight=1.0, replay_weight=0.5)(model, batch)
    text_nll = model(batch["text_ids"], labels=batch["text_ids"]).loss
    torch.testing.assert_close(loss, plain + 0.5 * text_nll)
    torch.testing.assert_close(metrics["text_nll"], text_nll.detach())
    assert "text_ids" not in data.collate([pairs[0], pairs[1]])  # validation pairs: no text
    with pytest.raises(ValueError, match="replay_weight > 0 needs replay_text"):
        train_dpo(model, pairs, TrainConfig(max_steps=1), replay_weight=1.0)
