"""PPO with a critic: GAE against its loop written out, the value loss and whitening against
their formulas, the critic's start, the settings' errors, a tiny run that logs its metrics and
resumes bit-exactly, and the stage."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from tiny import tiny_model

from minimind_lib.model import IGNORE_INDEX
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.training import TrainConfig
from minimind_lib.training.ppo import (
    ActorCritic,
    PPOSettings,
    ValueModel,
    explained_variance,
    gae,
    gae_loop,
    ppo_loss,
    token_rewards,
    train_ppo,
    value_loss,
    whiten,
)
from minimind_lib.training.rollout import Question

TOK = load_tokenizer()
QUESTIONS = [Question([{"role": "user", "content": f"{a} 和 {b} 哪个大？"}], str(max(a, b)),
                      "larger_number", "skill") for a, b in [(3, 7), (9, 2), (12, 5), (4, 40)]]


def _ragged(seed: int, rows: int = 5, width: int = 9) -> tuple[torch.Tensor, ...]:
    """Random rewards and values (float64) and a ragged answer mask: each row a prompt, an
    answer of its own length, then padding; row 0 has a hole (any mask must work)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(rows, width, generator=g, dtype=torch.float64)
    values = torch.randn(rows, width, generator=g, dtype=torch.float64)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for b in range(rows):
        start = int(torch.randint(0, 4, (1,), generator=g))
        length = int(torch.randint(1, width - start + 1, (1,), generator=g))
        mask[b, start:start + length] = True
    mask[0] = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0], dtype=torch.bool)
    return rewards, values, mask


# --- GAE ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (1.0, 1.0), (0.9, 0.0), (0.99, 0.5)])
@pytest.mark.parametrize("seed", range(3))
def test_gae_equals_the_loop_written_out(gamma, lam, seed):
    rewards, values, mask = _ragged(seed)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    adv_loop, ret_loop = gae_loop(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, adv_loop, rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, ret_loop, rtol=0, atol=1e-12)
    assert bool((adv[~mask] == 0).all() and (ret[~mask] == 0).all())


def test_gae_at_lambda_one_is_the_reward_to_go_minus_the_value():
    rewards, values, mask = _ragged(7)
    adv, ret = gae(rewards, values, mask, 0.9, 1.0)
    for b in range(len(mask)):
        positions = mask[b].nonzero().flatten().tolist()
        for i, t in enumerate(positions):
            to_go = sum(0.9 ** k * rewards[b, u].item() for k, u in enumerate(positions[i:]))
            assert ret[b, t].item() == pytest.approx(to_go, abs=1e-12)
            assert adv[b, t].item() == pytest.approx(to_go - values[b, t].item(), abs=1e-12)


def test_token_rewards_put_the_reward_on_the_last_answer_token_and_k1_on_every_one():
    logp = torch.tensor([[0.0, -1.0, -2.0, 0.0], [-1.0, -0.5, 0.0, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -1.0, 0.0], [-2.0, -0.5, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]])
    out = token_rewards(torch.tensor([1.0, 0.5]), logp, ref, mask, kl_coef=0.1)
    expected = torch.tensor([[0.0, -0.05, 0.1 + 1.0, 0.0], [-0.1, 0.0 + 0.5, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)
    no_kl = token_rewards(torch.tensor([1.0, 0.5]), logp, None, mask, kl_coef=0.1)
    torch.testing.assert_close(no_kl, torch.tensor([[0, 0, 1.0, 0], [0, 0.5, 0, 0]]))


# --- whitening and the value loss --------------------------------------------------------------


def test_whiten_equals_the_masked_formula():
    _, x, mask = _ragged(3)
    picked = [x[b, t].item() for b in range(len(x)) for t in range(x.shape[1]) if mask[b, t]]
    mean = sum(picked) / len(picked)
    std = math.sqrt(sum((v - mean) ** 2 for v in picked) / len(picked))
    out = whiten(x, mask)
    for b in range(len(x)):
        for t in range(x.shape[1]):
            expected = (x[b, t].item() - mean) / math.sqrt(std ** 2 + 1e-8) if mask[b, t] else 0.0
            assert out[b, t].item() == pytest.approx(expected, abs=1e-9)
    kept = out[mask]
    assert kept.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert kept.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("clip_eps", [0.05, 0.2, 1.0])
def test_value_loss_equals_the_formula(clip_eps):
    rewards, values, mask = _ragged(5)
    old = values + 0.4 * torch.randn(values.shape, generator=torch.Generator().manual_seed(1),
                                     dtype=torch.float64)
    returns = rewards
    terms = []
    for b in range(len(mask)):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                v, v_old, r = values[b, t].item(), old[b, t].item(), returns[b, t].item()
                clipped = min(max(v, v_old - clip_eps), v_old + clip_eps)
                terms.append(max((v - r) ** 2, (clipped - r) ** 2))
    expected = 0.5 * sum(terms) / len(terms)
    got = value_loss(values, old, returns, mask, clip_eps)
    assert got.item() == pytest.approx(expected, abs=1e-12)


def test_explained_variance_of_a_perfect_and_a_constant_critic():
    _, returns, mask = _ragged(2)
    returns = returns * mask
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    mean = returns[mask].mean()
    assert explained_variance(torch.full_like(returns, mean.item()), returns,
                              mask) == pytest.approx(0.0, abs=1e-9)


# --- the critic and the loss -------------------------------------------------------------------


def test_the_critic_copies_the_trunk_starts_at_zero_and_its_loss_leaves_the_policy_alone():
    policy = tiny_model()
    critic = ValueModel(policy)
    assert critic.model is not policy.model
    for a, b in zip(critic.model.parameters(), policy.model.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 7, 8, 9]])
    model = ActorCritic(policy, critic)
    logp, values = model(ids, labels)
    assert logp.shape == values.shape == (1, 4) and bool((values == 0).all())
    mask = labels[:, 1:] != IGNORE_INDEX
    batch = {"old_logps": logp.detach(), "old_values": values.detach(),
             "advantages": torch.zeros(1, 4), "returns": torch.ones(1, 4) * mask}
    loss, metrics = ppo_loss(logp, values, batch, mask, vf_coef=0.5)
    # advantages 0: only the value loss, 0.5 * 0.5 * mean((0 - 1)^2); ratio 1: no KL, no clipping
    assert loss.item() == pytest.approx(0.25) and metrics["value_loss"].item() == pytest.approx(0.5)
    assert metrics["approx_kl"].item() == 0 and metrics["clip_fraction"].item() == 0
    loss.backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in policy.parameters())
    assert critic.value_head.weight.grad.abs().sum() > 0


def test_settings_errors_name_the_field():
    for kw, field in [({"lam": -0.1}, "lam"), ({"gamma": 1.5}, "gamma"),
                      ({"kl_coef": -1.0}, "kl_coef"), ({"vf_coef": 0.0}, "vf_coef"),
                      ({"target_kl": 0.0}, "target_kl"), ({"reward": "bleu"}, "reward"),
                      ({"length_norm": "tokens"}, "length_norm"),
                      ({"value_clip_eps": 0.0}, "value_clip_eps"),
                      ({"ppo_epochs": 0}, "ppo_epochs"),
                      ({"max_new_tokens": 128}, "max_new_tokens"),
                      ({"mini_batches": 99}, "mini_batches")]:
        with pytest.raises(ValueError, match=f"PPOSettings.{field}"):
            _settings(**kw)
    assert _settings(target_kl=None).target_kl is None


# --- the loop ----------------------------------------------------------------------------------


def _settings(**kw) -> PPOSettings:
    base = dict(batch_size=2, seq_len=128, group_size=3, max_new_tokens=4, learning_rate=1e-3,
                max_steps=3, warmup_steps=1, save_every=2, ppo_epochs=2, mini_batches=2,
                target_kl=None)
    return PPOSettings(**{**base, **kw})


KEYS = ("reward", "accuracy", "kl", "approx_kl", "clip_fraction", "value_loss",
        "explained_variance", "response_length", "epochs_run", "sample_s", "update_s",
        "loss", "grad_norm")


class Interrupt(Exception):
    pass


def test_train_ppo_logs_its_metrics_and_resumes_bit_exactly(tmp_path):
    """Three steps whole; then killed after step 2 (its checkpoint written) and resumed: step 3
    samples, scores and updates policy and critic exactly as the uninterrupted run did.
    Dropout makes the restored RNG streams matter."""
    settings = _settings()
    config = TrainConfig.from_stage(settings, out_dir=tmp_path / "a", precision="fp32",
                                    progress=False, seed=3)
    whole = tiny_model(dropout=0.1)
    rows = train_ppo(whole, TOK, QUESTIONS, settings, config)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in KEYS:
        assert all(key in r for r in rows), key
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # sampled by the reference itself
    assert all(r["epochs_run"] == 2 for r in rows)
    logged = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").open()]
    assert [r["step"] for r in logged] == [1, 2, 3]

    def kill_after_step_2(row):
        if row["step"] == 2:
            raise Interrupt

    killed = replace(config, out_dir=tmp_path / "b")
    with pytest.raises(Interrupt):
        train_ppo(tiny_model(dropout=0.1), TOK, QUESTIONS, settings, killed,
                  callbacks=[kill_after_step_2])
    resumed = tiny_model(dropout=0.1)  # the starting weights: the reference is the start model
    rest = train_ppo(resumed, TOK, QUESTIONS, settings, killed, resume=True)
    assert [r["step"] for r in rest] == [3]
    for key in ("reward", "loss", "grad_norm", "kl", "value_loss", "approx_kl", "tokens"):
        assert rest[0][key] == rows[2][key], key  # exact
    for a, b in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_target_kl_stops_the_passes_early():
    """Dropout alone moves the training policy off pi_old (scored in eval mode): with a tiny
    target the passes stop after the first mini-batch; without one all 3 x 4 run (6 answers in
    4 mini-batches: sizes 2, 2, 1, 1)."""
    settings = _settings(max_steps=1, ppo_epochs=3, mini_batches=4, target_kl=1e-9)
    config = TrainConfig.from_stage(settings, precision="fp32", progress=False, seed=3)
    rows = train_ppo(tiny_model(dropout=0.1), TOK, QUESTIONS, settings, config)
    assert rows[0]["epochs_run"] == pytest.approx(1 / 4) and rows[0]["approx_kl"] > 1e-9
    rows = train_ppo(tiny_model(dropout=0.1), TOK, QUESTIONS, replace(settings, target_kl=None),
                     config)
    assert rows[0]["epochs_run"] == 3


# --- the stage ---------------------------------------------------------------------------------


def test_ppo_stage_from_the_reference_model_writes_curves_and_evals(tmp_path, capsys):
    """`ppo --init data/reference/sft` on a shrunken smoke profile: metrics rows carry the PPO
    curves (and val_accuracy), eval.json the scores before and after, a loadable model."""
    from minimind_lib import DATA_DIR
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stages import STAGES, StageContext
    from minimind_lib.model.checkpoint import load_model

    smoke = get_profile("smoke")
    profile = replace(smoke, eval_per_task=2,
                      ppo=replace(smoke.ppo, batch_size=2, group_size=2, max_steps=2,
                                  eval_every=2, save_every=2, warmup_steps=1))
    (tmp_path / "tokenizer").mkdir()
    TOK.save(tmp_path / "tokenizer" / "tokenizer.json")
    ctx = StageContext("ppo", profile, tmp_path, device="cpu", precision="fp32",
                       progress=False, init=DATA_DIR / "reference" / "sft")
    ctx.out_dir.mkdir()
    summary = STAGES["ppo"].run(ctx)
    rows = [json.loads(line) for line in (ctx.out_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2] and summary["steps"] == 2
    assert all({"reward", "kl", "value_loss", "explained_variance"} <= set(r) for r in rows)
    assert "val_accuracy" in rows[-1]
    saved = json.loads((ctx.out_dir / "eval.json").read_text())
    assert set(saved["models"]) == {"sft", "ppo"} and saved["tasks"] == smoke.ppo.tasks
    assert type(load_model(ctx.out_dir)).__name__ == "MiniMindForCausalLM"
    assert "held-out questions" in capsys.readouterr().out
