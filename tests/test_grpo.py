"""GRPO: each piece against its formula written out element by element (CS336 assignment 5
style), the loss's gradient, rollouts -> batches, resume, and the settings' errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from tiny import tiny_model

from minimind_lib.evaluation.questions import Answer
from minimind_lib.model import IGNORE_INDEX
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.training import TrainConfig
from minimind_lib.training.grpo import (
    GRPOLoss,
    GRPOSettings,
    Rollout,
    aggregate,
    clipped_surrogate,
    fitting_questions,
    group_advantages,
    grpo_loss,
    kl_k3,
    rollout,
    rollout_batches,
    train_grpo,
)
from minimind_lib.training.rollout import Question, Sample

TOK = load_tokenizer()


# --- 1. advantages ---------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_group_advantages_equal_the_formula(scale, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (5, 6), generator=g).double() / 2  # (P, G), ties included
    eps = 1e-6
    expected = torch.empty_like(rewards)
    for p in range(5):
        group = rewards[p].tolist()
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))  # Bessel
        for i, r in enumerate(group):
            expected[p, i] = (r - mean) / (std + eps) if scale else r - mean
    torch.testing.assert_close(group_advantages(rewards, scale, eps), expected, rtol=0, atol=1e-12)


def test_a_group_that_agrees_has_no_advantage_and_advantages_sum_to_zero():
    adv = group_advantages(torch.tensor([[1.0] * 8, [0.0] * 8, [1, 0, 0, 0, 0, 0, 0, 1.0]]))
    assert torch.equal(adv[:2], torch.zeros(2, 8))
    assert abs(adv[2].sum().item()) < 1e-6 and adv[2, 0] > 0 > adv[2, 1]


# --- 2. the clipped surrogate ----------------------------------------------------------------


@pytest.mark.parametrize("clip_eps", [0.1, 0.2, 0.5])
def test_clipped_surrogate_equals_the_formula(clip_eps):
    g = torch.Generator().manual_seed(1)
    logp = -3 * torch.rand(4, 7, generator=g, dtype=torch.float64)
    old = logp + 0.6 * (torch.rand(4, 7, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.tensor([1.5, -0.7, 0.0, -2.0], dtype=torch.float64)
    obj, clipped = clipped_surrogate(logp, old, adv, clip_eps)
    for b in range(4):
        for t in range(7):
            rho = math.exp(logp[b, t].item() - old[b, t].item())
            a = adv[b].item()
            bounded = min(max(rho, 1 - clip_eps), 1 + clip_eps)
            assert obj[b, t].item() == pytest.approx(min(rho * a, bounded * a), abs=1e-12)
            assert bool(clipped[b, t]) == (bounded * a < rho * a)


def test_no_gradient_where_the_ratio_is_clipped():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.05, 0.7]])).requires_grad_()  # rho vs old = 0
    obj, clipped = clipped_surrogate(logp, torch.zeros(1, 4), torch.tensor([1.0]), clip_eps=0.2)
    obj.sum().backward()
    # A > 0: rho = 1.5 is above 1 + eps (clipped, no gradient); 0.5 below 1 - eps is not
    # clipped (the min keeps the smaller, unclipped term): PPO's pessimistic bound
    assert clipped.tolist() == [[True, False, False, False]]
    assert logp.grad[0, 0] == 0 and (logp.grad[0, 1:] != 0).all()


# --- 3. the KL estimate ----------------------------------------------------------------------


def test_kl_k3_equals_the_formula_and_is_non_negative():
    g = torch.Generator().manual_seed(2)
    logp, ref = (-4 * torch.rand(50, generator=g, dtype=torch.float64) for _ in range(2))
    expected = torch.tensor([math.exp(r - p) - (r - p) - 1
                             for p, r in zip(logp.tolist(), ref.tolist(), strict=True)],
                            dtype=torch.float64)
    torch.testing.assert_close(kl_k3(logp, ref), expected, rtol=0, atol=1e-12)
    assert (kl_k3(logp, ref) >= 0).all() and kl_k3(logp, logp).abs().max() == 0


def test_kl_k3_is_an_unbiased_estimate_of_the_kl():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    exact = (p * (p / q).log()).sum().item()  # KL(p || q)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)  # tokens sampled from p
    estimates = kl_k3(p.log()[x], q.log()[x])
    # the sample mean is within 4 standard errors of the exact KL (a false failure ~ 1 in 15,000)
    se = estimates.std().item() / math.sqrt(len(x))
    assert abs(estimates.mean().item() - exact) < 4 * se, (estimates.mean().item(), exact, se)


# --- 4. length normalisation -----------------------------------------------------------------


def test_aggregate_sequence_and_constant_equal_their_formulas():
    g = torch.Generator().manual_seed(4)
    values = torch.randn(5, 9, generator=g, dtype=torch.float64)
    lengths = [9, 1, 4, 6, 2]
    mask = torch.tensor([[t < n for t in range(9)] for n in lengths])
    per_answer = [sum(values[b, t].item() for t in range(n)) for b, n in enumerate(lengths)]
    grpo = sum(s / n for s, n in zip(per_answer, lengths, strict=True)) / 5
    dr_grpo = sum(s / 16 for s in per_answer) / 5
    assert aggregate(values, mask, "sequence").item() == pytest.approx(grpo, abs=1e-12)
    assert aggregate(values, mask, "constant", 16).item() == pytest.approx(dr_grpo, abs=1e-12)
    with pytest.raises(ValueError, match="needs max_new_tokens"):
        aggregate(values, mask, "constant")
    with pytest.raises(ValueError, match="choose one of sequence, constant"):
        aggregate(values, mask, "token")


def test_sequence_normalisation_gives_long_wrong_answers_a_smaller_penalty_per_token():
    """The Dr. GRPO point: with 1/|o_i| a token of a long answer gets a smaller gradient than a
    token of a short one with the same advantage; with a constant every token is alike."""
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0, 0]]).bool()
    adv = torch.tensor([-1.0, -1.0])  # two wrong answers, long and short
    for norm, ratio in (("sequence", 2 / 8), ("constant", 1.0)):
        logp = torch.full((2, 8), -1.0, requires_grad=True)
        loss, _ = grpo_loss(logp, logp.detach(), None, adv, mask, length_norm=norm,
                            max_new_tokens=8)
        loss.backward()
        assert logp.grad[0, 0].item() / logp.grad[1, 0].item() == pytest.approx(ratio)


# --- 5. the loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["sequence", "constant"])
def test_grpo_loss_equals_eq3_written_out(norm):
    g = torch.Generator().manual_seed(5)
    B, T, eps, beta = 4, 6, 0.2, 0.04
    logp = -2 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old = logp + 0.5 * (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)
    ref = logp + 0.5 * (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = [6, 3, 1, 5]
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    total = 0.0
    for b, n in enumerate(lengths):  # (1/G) sum_i (1/|o_i|) sum_t [min(...) - beta KL]
        terms = 0.0
        for t in range(n):
            rho = math.exp(logp[b, t] - old[b, t])
            a = adv[b].item()
            surrogate = min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)
            d = (ref[b, t] - logp[b, t]).item()
            terms += surrogate - beta * (math.exp(d) - d - 1)
        total += terms / (n if norm == "sequence" else 8)
    loss, metrics = grpo_loss(logp, old, ref, adv, mask, clip_eps=eps, kl_beta=beta,
                              length_norm=norm, max_new_tokens=8)
    assert loss.item() == pytest.approx(-total / B, abs=1e-12)
    kl = sum(math.exp(d) - d - 1 for b, n in enumerate(lengths) for t in range(n)
             for d in [(ref[b, t] - logp[b, t]).item()]) / sum(lengths)
    assert metrics["kl"].item() == pytest.approx(kl, abs=1e-12)


def test_on_policy_gradient_is_the_advantage_weighted_score():
    """With pi_old = pi_theta (one update per sample) and no KL, d loss / d log pi(o_it) is
    -A_i / (|o_i| B): the REINFORCE gradient with the group baseline."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]]).bool()
    adv = torch.tensor([0.8, -1.2])
    loss, metrics = grpo_loss(logp, logp.detach(), None, adv, mask)
    loss.backward()
    expected = torch.tensor([[-0.8 / 3 / 2] * 3, [1.2 / 1 / 2, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    assert metrics["clip_fraction"].item() == 0 and metrics["ratio"].item() == pytest.approx(1)
    assert "kl" not in metrics


# --- rollouts, batches and the loss function on a model -----------------------------------------


QUESTIONS = [Question([{"role": "user", "content": f"{a} 和 {b} 哪个大？"}], str(max(a, b)),
                      "larger_number", "skill") for a, b in [(3, 7), (9, 2), (12, 5), (4, 40)]]


def _sample(question: Question, text: str, ended: bool = True) -> Sample:
    from minimind_lib.tokenizer import encode_chat

    end = [TOK.token_to_id("<|im_end|>")] if ended else []
    return Sample(encode_chat(TOK, question.messages, add_generation_prompt=True),
                  TOK.encode(text) + end, Answer(text, ended))


def test_rollout_batches_label_exactly_the_sampled_answers():
    groups = [[_sample(q, q.answer), _sample(q, "1"), _sample(q, "123", ended=False)]
              for q in QUESTIONS[:3]]
    rewards = torch.tensor([[1.0, 0.0, 0.0]] * 3)
    ro = Rollout(QUESTIONS[:3], groups, rewards, group_advantages(rewards))
    batches = rollout_batches(ro, batch_size=2, pad_id=0)
    assert [len(b["input_ids"]) for b in batches] == [6, 3]  # 2 questions x 3, then 1 x 3
    batch = batches[0]
    for row, sample in enumerate(s for g in groups[:2] for s in g):
        labelled = batch["labels"][row][batch["labels"][row] != IGNORE_INDEX].tolist()
        assert labelled == sample.response
        assert batch["input_ids"][row, :len(sample.prompt)].tolist() == sample.prompt
    torch.testing.assert_close(batch["advantages"], ro.advantages[:2].flatten())
    stats = ro.stats()
    assert (stats["accuracy"] == pytest.approx(1 / 3)
            and stats["format_rate"] == pytest.approx(2 / 3))
    assert stats["signal"] == 1.0 and stats["reward"] == pytest.approx(1 / 3)


def test_only_groups_that_disagree_are_kept_for_the_update():
    groups = [[_sample(q, q.answer), _sample(q, "1")] for q in QUESTIONS[:3]]
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    ro = Rollout(QUESTIONS[:3], groups, rewards, group_advantages(rewards))
    kept = ro.with_signal()
    assert kept.questions == QUESTIONS[:1] and kept.groups == groups[:1]
    torch.testing.assert_close(kept.advantages, ro.advantages[:1])
    assert ro.stats()["signal"] == pytest.approx(1 / 3)


def test_grpo_loss_on_a_model_at_the_start_is_minus_the_mean_advantage_plus_zero_kl():
    model = tiny_model()
    groups = [[_sample(q, q.answer), _sample(q, "1"), _sample(q, "77")] for q in QUESTIONS[:2]]
    rewards = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    batch = rollout_batches(Rollout(QUESTIONS[:2], groups, rewards, group_advantages(rewards)),
                            batch_size=2, pad_id=0)[0]
    from minimind_lib.training.logprobs import token_logprobs

    with torch.no_grad():
        batch["ref_logps"] = token_logprobs(model, batch["input_ids"], batch["labels"])
    loss, metrics = GRPOLoss(kl_beta=0.1)(model, batch)
    # ratio 1 and policy == reference: the loss is -mean(A) (= 0: advantages sum to 0 per group)
    assert loss.item() == pytest.approx(-batch["advantages"].mean().item(), abs=1e-6)
    assert metrics["kl"].item() == pytest.approx(0.0, abs=1e-6)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_rollout_rewards_come_from_the_checker():
    model = tiny_model()
    settings = GRPOSettings(batch_size=2, seq_len=128, group_size=4, max_new_tokens=4,
                            format_reward=0.25)
    ro = rollout(model, TOK, QUESTIONS[:2], settings, torch.Generator().manual_seed(0))
    assert ro.rewards.shape == (2, 4)
    for q, g, r in zip(ro.questions, ro.groups, ro.rewards, strict=True):
        for s, value in zip(g, r.tolist(), strict=True):
            right = s.answer.follows_format and s.answer.text.strip() == q.answer
            assert value == pytest.approx(right + 0.25 * s.answer.follows_format)
            assert len(s.response) <= 4


# --- the loop ------------------------------------------------------------------------------------


def _settings(**kw) -> GRPOSettings:
    base = dict(batch_size=2, seq_len=128, group_size=4, max_new_tokens=4, learning_rate=1e-3,
                max_steps=4, warmup_steps=1, save_every=2)
    return GRPOSettings(**{**base, **kw})


def test_train_grpo_logs_reward_kl_and_length_and_resumes_exactly(tmp_path):
    settings = _settings(policy_epochs=2)
    config = TrainConfig.from_stage(settings, out_dir=tmp_path / "a", precision="fp32",
                                    progress=False, seed=3)
    whole = tiny_model()
    rows = train_grpo(whole, TOK, QUESTIONS, settings, config)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward", "kl", "response_length", "loss", "clip_fraction", "grad_norm"):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first update starts at the reference
    # half the steps, then resume: the same weights as the uninterrupted run
    halves = tiny_model()
    first = replace(config, out_dir=tmp_path / "b", max_steps=2)
    train_grpo(halves, TOK, QUESTIONS, settings, first)
    resumed = tiny_model()  # the starting weights, as a stage loads them; the checkpoint has step 2
    rest = train_grpo(resumed, TOK, QUESTIONS, settings, replace(first, max_steps=4),
                      resume=True)
    assert [r["step"] for r in rest] == [3, 4]
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


class Interrupt(Exception):
    pass


def test_grpo_resume_is_bit_exact_on_cpu(tmp_path):
    """Killed after step 3 (a checkpoint at 2), resumed: steps 3-4 sample, reward and update
    exactly as the uninterrupted run did. Dropout makes the restored RNG streams matter (GRPO's
    own loop saved none before it ran on the shared engine)."""
    settings = _settings(policy_epochs=2)
    config = TrainConfig.from_stage(settings, out_dir=tmp_path / "a", precision="fp32",
                                    progress=False, seed=3)
    whole = tiny_model(dropout=0.1)
    rows = train_grpo(whole, TOK, QUESTIONS, settings, config)

    def kill_after_step_3(row):
        if row["step"] == 3:
            raise Interrupt

    killed = replace(config, out_dir=tmp_path / "b")
    with pytest.raises(Interrupt):
        train_grpo(tiny_model(dropout=0.1), TOK, QUESTIONS, settings, killed,
                   callbacks=[kill_after_step_3])
    resumed = tiny_model(dropout=0.1)  # the starting weights: the reference is the start model
    rest = train_grpo(resumed, TOK, QUESTIONS, settings, killed, resume=True)
    assert [r["step"] for r in rest] == [3, 4]
    for key in ("reward", "loss", "grad_norm", "kl", "response_length", "tokens"):
        assert [r[key] for r in rest] == [r[key] for r in rows[2:]], key  # exact
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_settings_and_question_errors():
    with pytest.raises(ValueError, match="group_size must be at least 2"):
        _settings(group_size=1)
    with pytest.raises(ValueError, match="length_norm"):
        _settings(length_norm="tokens")
    with pytest.raises(ValueError, match="must be below seq_len"):
        _settings(max_new_tokens=128)
    long = Question([{"role": "user", "content": "很长的问题" * 60}], "1", "t", "skill")
    assert fitting_questions(TOK, [long, QUESTIONS[0]], _settings()) == [QUESTIONS[0]]
    config = TrainConfig.from_stage(_settings(), precision="fp32", progress=False)
    with pytest.raises(ValueError, match="needs at least 2 questions"):
        train_grpo(tiny_model(), TOK, [long, QUESTIONS[0]], _settings(), config)


# --- the stage -------------------------------------------------------------------------------


def test_grpo_stage_from_the_reference_model_writes_curves_and_evals(tmp_path, capsys):
    """`grpo --init data/reference/sft` on a shrunken smoke profile: metrics rows carry reward,
    kl, response_length (and val_accuracy), eval.json the scores before and after."""
    from minimind_lib import DATA_DIR
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stages import STAGES, StageContext

    smoke = get_profile("smoke")
    profile = replace(smoke, eval_per_task=2,
                      grpo=replace(smoke.grpo, batch_size=2, group_size=4, max_steps=2,
                                   eval_every=2, save_every=2, warmup_steps=1))
    (tmp_path / "tokenizer").mkdir()
    TOK.save(tmp_path / "tokenizer" / "tokenizer.json")
    ctx = StageContext("grpo", profile, tmp_path, device="cpu", precision="fp32",
                       progress=False, init=DATA_DIR / "reference" / "sft")
    ctx.out_dir.mkdir()
    summary = STAGES["grpo"].run(ctx)
    rows = [json.loads(line) for line in (ctx.out_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2] and summary["steps"] == 2
    assert all({"reward", "kl", "response_length", "accuracy", "signal"} <= set(r) for r in rows)
    assert "val_accuracy" in rows[-1]
    saved = json.loads((ctx.out_dir / "eval.json").read_text())
    assert set(saved["models"]) == {"sft", "grpo"} and saved["tasks"] == smoke.grpo.tasks
    assert (ctx.out_dir / "model.safetensors").is_file()
    assert "held-out questions" in capsys.readouterr().out
