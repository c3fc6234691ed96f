"""Proximal Policy Optimization with a learned critic and verifiable rewards (GRPO's sibling).

PPO (Schulman et al. 2017, "Proximal Policy Optimization Algorithms") as RLHF runs it on a
language model (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences";
Ouyang et al. 2022, "InstructGPT", eq. 2): every generated token is an action, the prompt plus
the tokens so far is the state, and a **critic** ``V(s_t)`` learns how much reward to expect
from each state, so every token gets its own advantage (GRPO, ``training.grpo``, drops the
critic and gives every token of an answer its group-normalised outcome instead).

1. **Per-token reward.** The checker's score ``R`` (``rollout.verifiable_reward``, as GRPO's)
   sits on the answer's last token; every answer token pays a KL penalty to the frozen
   starting model, the **k1** estimate of the sampled token (classic RLHF: the penalty is part
   of the reward, so the critic learns it too; GRPO and MiniMind's ``train_ppo.py`` instead add
   the ``k3`` estimate to the loss)::

       r_t = -beta (log pi_old(y_t) - log pi_ref(y_t))  +  [t = last] R(q, o)

2. **GAE** (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
   Advantage Estimation", eqs. 11-16), with ``V = 0`` after the last token (the answer ended)::

       delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
       A_t = sum_k (gamma lambda)^k delta_{t+k}  =  delta_t + gamma lambda A_{t+1}
       R_t = A_t + V(s_t)                                         (the critic's target)

   ``lambda = 1`` gives the Monte-Carlo advantage (reward-to-go minus V), ``lambda = 0`` the
   one-step TD error: lower variance, more bias from a poor critic.
3. **Policy loss**: the clipped surrogate (eq. 7; ``grpo.clipped_surrogate``) of the whitened
   advantages (masked mean 0, std 1 over the batch's answer tokens), aggregated as GRPO does
   (``grpo.aggregate``).
4. **Value loss**, clipped around the values at sampling time as OpenAI's baselines do
   (Engstrom et al. 2020, "Implementation Matters in Deep RL", sec. 3)::

       L_V = 1/2 mean_t max((V_t - R_t)^2, (clip(V_t, V_old_t - eps_v, V_old_t + eps_v) - R_t)^2)

5. **Updates**: ``ppo_epochs`` passes over the round's answers in ``mini_batches`` shuffled
   mini-batches, each one optimizer step of ``L_pi + vf_coef L_V``; the passes stop early once
   a mini-batch's approximate KL to the sampling policy (``k3`` of pi_old against pi_theta, on
   the sampled tokens) exceeds ``target_kl``.

**The critic** (``ValueModel``) is a copy of the policy's trunk (embeddings, blocks, final
norm) with a linear value head, as MiniMind's ``CriticModel`` is: its own weights, so the
value loss's gradient never reaches the policy and needs no balancing against it, and it
starts from the SFT model's features. A shared trunk (one model, two heads) costs half the
memory and compute, but couples the two losses through ``vf_coef``. The head starts at zero
(every value 0: deterministic, no random draw). Policy and critic train as one module
(``ActorCritic``) in the shared engine (``loop.train``): one optimizer, one schedule (the
critic learns at the policy's rate; MiniMind gives it its own), one global gradient clip, and
checkpoints that hold both, so a resumed run continues bit-exactly.

>>> adv, ret = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.5]]),
...                torch.ones(1, 3), gamma=1.0, lam=0.0)
>>> adv, ret                   # lambda 0: the TD errors; only the last token sees the reward
(tensor([[0.0000, 0.0000, 0.5000]]), tensor([[0.5000, 0.5000, 1.0000]]))
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from minimind_lib.data.conversations import pad_sft_batch
from minimind_lib.model.decoder import IGNORE_INDEX, MiniMindForCausalLM
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import END_OF_TEXT
from minimind_lib.training.grpo import (
    LENGTH_NORMS,
    Rollout,
    aggregate,
    clipped_surrogate,
    fitting_questions,
    grade,
    greedy_accuracy,
    kl_k3,
    question_batch,
    require_enough,
)
from minimind_lib.training.logprobs import frozen_copy, token_logprobs
from minimind_lib.training.loop import StepResult, TrainRun, train, train_step
from minimind_lib.training.rollout import REWARDS, Question, sample_answers
from minimind_lib.training.settings import TrainConfig, TrainSettings, require_positive


@dataclass(frozen=True)
class PPOSettings(TrainSettings):
    """A PPO run's hyper-parameters. A step samples ``group_size`` answers to each of
    ``batch_size * accumulation_steps`` questions (GRPO's budget), then makes ``ppo_epochs``
    passes over them in ``mini_batches`` optimizer steps each (fewer once ``target_kl`` is
    crossed). ``seq_len`` caps prompt + answer (longer prompts are left out).

    >>> PPOSettings(lam=1.5)
    Traceback (most recent call last):
    ...
    ValueError: PPOSettings.lam must be in [0, 1], got 1.5
    """

    group_size: int = 8  # answers per question
    max_new_tokens: int = 16  # answer budget (the "constant" length normaliser, too)
    temperature: float = 1.0  # sampling temperature; the policy trained is softmax(logits / T)
    clip_eps: float = 0.2  # the policy ratio is clipped to [1 - eps, 1 + eps]
    value_clip_eps: float = 0.2  # values move at most this far from V_old before clipping
    vf_coef: float = 0.5  # weight of the value loss
    gamma: float = 1.0  # discount per token
    lam: float = 0.95  # GAE lambda: 1 Monte-Carlo, 0 one-step TD
    kl_coef: float = 0.04  # per-token k1 penalty to the starting model, in the reward (0: none)
    ppo_epochs: int = 2  # passes over each sampled batch
    mini_batches: int = 2  # optimizer steps per pass
    target_kl: float | None = 0.1  # stop the passes past this approx KL to pi_old (None: never)
    reward: str = "exact"  # "exact": 1 for the right answer; "char_f1": partial credit
    format_reward: float = 0.0  # bonus for a finished, well-formed reply, right or wrong
    length_norm: str = "sequence"  # "sequence": mean per answer; "constant": Dr. GRPO's
    # task or family names (rollout.select_tasks)
    tasks: str = "larger_number,arithmetic,first_word"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "group_size", "max_new_tokens", "ppo_epochs", "mini_batches",
                         "temperature", "clip_eps", "value_clip_eps", "vf_coef")
        name = type(self).__name__
        for field_name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, field_name) <= 1.0:
                raise ValueError(f"{name}.{field_name} must be in [0, 1], got "
                                 f"{getattr(self, field_name)}")
        for field_name in ("kl_coef", "format_reward"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"{name}.{field_name} must be >= 0, got "
                                 f"{getattr(self, field_name)}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ValueError(f"{name}.target_kl must be positive or None, got {self.target_kl}")
        for field_name, choices in (("reward", REWARDS), ("length_norm", LENGTH_NORMS)):
            if getattr(self, field_name) not in choices:
                raise ValueError(f"{name}.{field_name} is {getattr(self, field_name)!r}; "
                                 f"choose one of {', '.join(choices)}")
        if self.max_new_tokens >= self.seq_len:
            raise ValueError(f"{name}.max_new_tokens ({self.max_new_tokens}) must be below "
                             f"seq_len ({self.seq_len}), which holds prompt and answer")
        answers = self.batch_size * self.accumulation_steps * self.group_size
        if self.mini_batches > answers:
            raise ValueError(f"{name}.mini_batches ({self.mini_batches}) must be at most the "
                             f"answers a step samples ({answers})")


# --- the critic --------------------------------------------------------------------------------


class ValueModel(nn.Module):
    """The critic: a copy of ``policy``'s trunk (``policy.model``) and a linear value head,
    ``V(s_t)`` per position (B, T): the value of the prefix ending at token t. The head starts
    at zero, so every value starts at 0.

    >>> from minimind_lib.model.config import MiniMindConfig
    >>> policy = MiniMindForCausalLM(MiniMindConfig(vocab_size=16, hidden_size=8,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> ValueModel(policy)(torch.tensor([[3, 4, 5]]))
    tensor([[0., 0., 0.]], grad_fn=<SqueezeBackward1>)
    """

    def __init__(self, policy: MiniMindForCausalLM) -> None:
        super().__init__()
        self.model = copy.deepcopy(policy.model)  # embeddings, blocks, final norm
        self.value_head = nn.Linear(policy.config.hidden_size, 1)
        self.value_head.to(next(self.model.parameters()).device)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: Tensor) -> Tensor:
        hidden, _ = self.model(input_ids)  # (B, T, C)
        return self.value_head(hidden).float().squeeze(-1)  # (B, T)


class ActorCritic(nn.Module):
    """Policy and critic as the one module the engine trains (one optimizer, one checkpoint).
    ``forward(input_ids, labels)`` -> the answer tokens' log-probs under the policy at
    ``temperature`` and the critic's values, both (B, T-1) and aligned: entry t belongs to the
    state before token t+1 (``logprobs.token_logprobs``'s layout)."""

    def __init__(self, policy: MiniMindForCausalLM, critic: ValueModel,
                 temperature: float = 1.0) -> None:
        super().__init__()
        self.policy, self.critic, self.temperature = policy, critic, temperature

    def forward(self, input_ids: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        logp = token_logprobs(self.policy, input_ids, labels, self.temperature)  # (B, T-1)
        return logp, self.critic(input_ids)[:, :-1]  # (B, T-1) each

    def gradient_checkpointing_enable(self) -> ActorCritic:
        self.policy.gradient_checkpointing_enable()
        self.critic.model.gradient_checkpointing = True
        return self


# --- rewards, advantages, losses ---------------------------------------------------------------


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the ``mask``ed entries (0 when there are none).

    >>> masked_mean(torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[1, 1, 0]]))
    tensor(2.)
    """
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def token_rewards(rewards: Tensor, logp: Tensor, ref_logp: Tensor | None, mask: Tensor,
                  kl_coef: float) -> Tensor:
    """Per-token rewards (B, T): ``-kl_coef (logp - ref_logp)`` on every answer token (k1; none
    when ``ref_logp`` is None) plus each answer's reward (B,) on its last ``mask``ed token.

    >>> token_rewards(torch.tensor([1.0]), torch.tensor([[-1.0, -2.0, 0.0]]),
    ...               torch.tensor([[-1.5, -2.0, 0.0]]), torch.tensor([[1, 1, 0]]), kl_coef=0.1)
    tensor([[-0.0500,  1.0000,  0.0000]])
    """
    mask = mask.to(logp.dtype)
    out = kl_coef * (ref_logp - logp) * mask if ref_logp is not None else torch.zeros_like(logp)
    T = mask.shape[1]
    last = T - 1 - mask.flip(1).argmax(dim=1)  # (B,) the last answer token of each row
    out[torch.arange(len(rewards), device=out.device), last] += rewards.to(out)
    return out


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimates and returns (B, T) each, for per-token ``rewards`` and
    ``values`` (B, T) over the ``mask``ed (answer) tokens, by the recursion
    ``A_t = delta_t + gamma lam A_{t+1}``, ``delta_t = r_t + gamma V_{t+1} - V_t``, scanned from
    the end, all rows at once. The "next" token of a masked entry is the next masked one in its
    row; after the last, ``V = A = 0``. Returns ``R_t = A_t + V_t``; both are 0 off the mask.

    >>> adv, ret = gae(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.2, 0.4, 9.0]]),
    ...                torch.tensor([[1, 1, 0]]), gamma=1.0, lam=1.0)
    >>> adv, ret                            # lambda 1: reward-to-go minus the value
    (tensor([[0.8000, 0.6000, 0.0000]]), tensor([[1., 1., 0.]]))
    """
    mask = mask.bool()
    advantages = torch.zeros_like(values)  # (B, T)
    next_value = values.new_zeros(values.shape[0])  # (B,)
    next_adv = values.new_zeros(values.shape[0])  # (B,)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        adv = delta + gamma * lam * next_adv  # (B,)
        here = mask[:, t]
        advantages[:, t] = torch.where(here, adv, 0.0)
        next_value = torch.where(here, values[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    return advantages, (advantages + values) * mask


def gae_loop(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float,
             lam: float) -> tuple[Tensor, Tensor]:
    """``gae`` written out: a plain double loop over rows and their masked positions, from the
    last token back (the tests check ``gae`` against it).

    >>> gae_loop(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.2, 0.4]]), torch.ones(1, 2),
    ...          gamma=1.0, lam=0.0)[0]
    tensor([[0.2000, 0.6000]])
    """
    advantages, returns = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        positions = [t for t in range(values.shape[1]) if mask[b, t]]
        next_value, next_adv = 0.0, 0.0
        for t in reversed(positions):
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b, t].item()
            advantages[b, t] = next_adv
            returns[b, t] = next_adv + next_value
    return advantages, returns


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``x`` (B, T) shifted and scaled to mean 0, std 1 over its ``mask``ed entries (population
    variance), 0 off the mask.

    >>> whiten(torch.tensor([[1.0, 3.0, 100.0]]), torch.tensor([[1, 1, 0]]))
    tensor([[-1.,  1.,  0.]])
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask.to(x.dtype)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               clip_eps: float) -> Tensor:
    """The clipped value loss ``1/2 mean max((V - R)^2, (clip(V, V_old - eps, V_old + eps) -
    R)^2)`` over the ``mask``ed tokens: a value that moved more than ``clip_eps`` from
    ``old_values`` past its target is not pulled further by this batch. Below: V moved from
    0 to 1 toward R = 2, the clipped 0.5 is further off, so ``max`` keeps (0.5 - 2)^2.

    >>> value_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]),
    ...            torch.tensor([[2.0, 0.0]]), torch.tensor([[1, 0]]), clip_eps=0.5)
    tensor(1.1250)
    """
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)  # (B, T)
    per_token = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)  # (B, T)
    return 0.5 * masked_mean(per_token, mask)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the ``mask``ed tokens: 1 for a critic that predicts the
    returns, 0 for one no better than their mean, negative for worse (nan when the returns do
    not vary).

    >>> explained_variance(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 3.0]]), torch.ones(1, 2))
    0.75
    """
    var_r = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    diff = returns - values
    var_d = masked_mean((diff - masked_mean(diff, mask)) ** 2, mask)
    return float("nan") if var_r.item() == 0 else 1.0 - (var_d / var_r).item()


def ppo_loss(logp: Tensor, values: Tensor, batch: dict[str, Tensor], mask: Tensor, *,
             clip_eps: float = 0.2, value_clip_eps: float = 0.2, vf_coef: float = 0.5,
             length_norm: str = "sequence",
             max_new_tokens: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """``L_pi + vf_coef L_V`` of a mini-batch: log-probs and values (B, T-1) of the policy and
    critic being trained, and the ``batch``'s ``old_logps``, ``old_values``, ``advantages``
    (whitened) and ``returns`` (B, T-1), from sampling time. Also returns detached metrics:
    ``policy_loss``, ``value_loss``, ``clip_fraction`` and ``approx_kl`` (mean k3 of pi_old
    against pi_theta over the answer tokens)."""
    old_logp, advantages = batch["old_logps"], batch["advantages"]
    # grpo.clipped_surrogate takes one advantage per row: per-token advantages are rows of one
    objective, clipped = clipped_surrogate(logp.reshape(-1, 1), old_logp.reshape(-1, 1),
                                           advantages.reshape(-1), clip_eps)  # (B*T, 1)
    objective, clipped = objective.view_as(logp), clipped.view_as(logp)  # (B, T)
    policy_loss = -aggregate(objective, mask, length_norm, max_new_tokens)
    v_loss = value_loss(values, batch["old_values"], batch["returns"], mask, value_clip_eps)
    metrics = {"policy_loss": policy_loss.detach(), "value_loss": v_loss.detach(),
               "clip_fraction": masked_mean(clipped.float(), mask),
               "approx_kl": masked_mean(kl_k3(old_logp, logp.detach()), mask)}
    return policy_loss + vf_coef * v_loss, metrics


@dataclass
class PPOLoss:
    """``loss_fn`` for ``loop.train_step``: ``ppo_loss`` of a mini-batch, called with the
    engine's ``ActorCritic`` (or its compiled wrapper)."""

    clip_eps: float = 0.2
    value_clip_eps: float = 0.2
    vf_coef: float = 0.5
    length_norm: str = "sequence"
    max_new_tokens: int | None = None

    def __call__(self, model: nn.Module, batch: dict) -> tuple[Tensor, dict[str, Tensor]]:
        logp, values = model(batch["input_ids"], batch["labels"])  # (B, T-1) each
        mask = batch["labels"][:, 1:] != IGNORE_INDEX  # (B, T-1)
        return ppo_loss(logp, values, batch, mask, clip_eps=self.clip_eps,
                        value_clip_eps=self.value_clip_eps, vf_coef=self.vf_coef,
                        length_norm=self.length_norm, max_new_tokens=self.max_new_tokens)


# --- the step the engine repeats ---------------------------------------------------------------


@torch.no_grad()
def score_batch(model: ActorCritic, reference: nn.Module | None, batch: dict[str, Tensor],
                rewards: Tensor, settings: PPOSettings, run: TrainRun,
                chunk: int = 64) -> dict[str, float]:
    """Add to ``batch`` (all of a round's answers) what its updates need, computed once before
    them: ``old_logps`` and ``old_values`` (the policy and critic that sampled), the per-token
    rewards with the KL penalty, the GAE ``advantages`` (whitened) and ``returns`` (B, T-1).
    Returns the round's ``kl`` (mean k3 to the reference) and ``explained_variance``."""
    was_training = model.training
    model.eval()
    parts: dict[str, list[Tensor]] = {"old_logps": [], "old_values": [], "ref_logps": []}
    for start in range(0, len(batch["input_ids"]), chunk):
        ids = batch["input_ids"][start:start + chunk].to(run.device)
        labels = batch["labels"][start:start + chunk].to(run.device)
        with run.precision.context(run.device):
            logp, values = model(ids, labels)
            parts["old_logps"].append(logp.float())
            parts["old_values"].append(values.float())
            if reference is not None:
                parts["ref_logps"].append(token_logprobs(reference.to(run.device), ids, labels,
                                                         settings.temperature).float())
    model.train(was_training)
    old_logp, old_values = torch.cat(parts["old_logps"]), torch.cat(parts["old_values"])
    ref_logp = torch.cat(parts["ref_logps"]) if reference is not None else None
    mask = (batch["labels"][:, 1:] != IGNORE_INDEX).to(run.device)  # (B, T-1)
    per_token = token_rewards(rewards.to(run.device), old_logp, ref_logp, mask,
                              settings.kl_coef)
    advantages, returns = gae(per_token, old_values, mask, settings.gamma, settings.lam)
    batch.update(old_logps=old_logp, old_values=old_values, returns=returns,
                 advantages=whiten(advantages, mask))
    stats = {"explained_variance": explained_variance(old_values, returns, mask)}
    if ref_logp is not None:
        stats["kl"] = masked_mean(kl_k3(old_logp, ref_logp), mask).item()
    return stats


class PPOStep:
    """The engine's step for PPO (``grpo.GRPOStep``'s sibling): one sampling round and its
    updates.

    It takes the next ``batch_size * accumulation_steps`` questions of the run's stream,
    samples ``group_size`` answers to each with the current policy (a generator seeded by
    (seed, step), so a resumed run samples what an uninterrupted one would), rewards them,
    scores them once (``score_batch``), then runs ``loop.train_step`` on ``mini_batches``
    shuffled mini-batches (a permutation seeded by (seed, step, pass)) for up to
    ``ppo_epochs`` passes. ``train`` does the rest: learning rate, logging, validation,
    checkpoints and bit-exact resume."""

    desc = "ppo"

    def __init__(self, tokenizer: BPETokenizer, settings: PPOSettings, config: TrainConfig,
                 reference: nn.Module | None) -> None:
        self.tokenizer, self.settings, self.reference = tokenizer, settings, reference
        self.seed, self.grad_clip = config.seed, config.grad_clip
        self.accumulation_steps = config.accumulation_steps
        self.loss_fn = PPOLoss(settings.clip_eps, settings.value_clip_eps, settings.vf_coef,
                               settings.length_norm, settings.max_new_tokens)

    def __call__(self, run: TrainRun, step: int) -> StepResult:
        if run.info.world_size > 1:
            raise ValueError("PPO runs in one process (its rollouts are not split across "
                             "ranks); start it without torchrun")
        settings, t0 = self.settings, time.perf_counter()
        questions = [q for _ in range(self.accumulation_steps) for q in next(run.batches)]
        generator = torch.Generator(run.device).manual_seed(self.seed * 1_000_003 + step)
        with run.precision.context(run.device):
            groups = sample_answers(run.model.policy, self.tokenizer, questions,
                                    settings.group_size, max_new_tokens=settings.max_new_tokens,
                                    temperature=settings.temperature, generator=generator)
        rewards = grade(questions, groups, settings.format_reward, settings.reward)  # (P, G)
        rows = [{"input_ids": torch.tensor(s.prompt + s.response),
                 "labels": torch.tensor(s.labels())} for g in groups for s in g]
        batch = pad_sft_batch(rows, self.tokenizer.token_to_id(END_OF_TEXT))  # (P*G, T) each
        stats = score_batch(run.model, self.reference, batch, rewards.flatten(), settings, run)
        t1 = time.perf_counter()
        results = self._update(run, batch, step)
        values = {k: sum(r.values[k] for r in results) / len(results) for k in results[0].values}
        stats |= Rollout(questions, groups, rewards, torch.zeros_like(rewards)).stats()
        return StepResult({**stats, **values, "epochs_run": len(results) / settings.mini_batches,
                           "sample_s": t1 - t0, "update_s": time.perf_counter() - t1},
                          sum(r.tokens for r in results), all(r.finite for r in results))

    def _update(self, run: TrainRun, batch: dict[str, Tensor], step: int) -> list[StepResult]:
        """Up to ``ppo_epochs`` passes of ``mini_batches`` optimizer steps; the passes stop
        after the first mini-batch whose approximate KL to pi_old exceeds ``target_kl``."""
        settings, results = self.settings, []
        for epoch in range(settings.ppo_epochs):
            order = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 101 + epoch)
            perm = torch.randperm(len(batch["input_ids"]), generator=order)
            for rows in perm.tensor_split(settings.mini_batches):  # sizes differ by <= 1
                mini = {k: v[rows.to(v.device)] for k, v in batch.items()}
                results.append(train_step(run.forward, iter([mini]), run.optimizer, run.scaler,
                                          run.params, self.loss_fn, accumulation_steps=1,
                                          grad_clip=self.grad_clip, precision=run.precision,
                                          device=run.device))
                if (settings.target_kl is not None
                        and results[-1].values["approx_kl"] > settings.target_kl):
                    return results
        return results

    @staticmethod
    def postfix(row: dict) -> dict[str, str]:
        return {"reward": f"{row['reward']:.3f}", "kl": f"{row.get('kl', 0.0):.4f}",
                "v_loss": f"{row['value_loss']:.3f}"}


def train_ppo(policy: MiniMindForCausalLM, tokenizer: BPETokenizer,
              questions: Sequence[Question], settings: PPOSettings, config: TrainConfig, *,
              resume: bool = False, held_out: Sequence[Question] = (),
              callbacks: Sequence[Callable[[dict], None]] = ()) -> list[dict]:
    """PPO-train ``policy`` in place on ``questions``; return this call's metrics rows.

    The critic (``ValueModel``) is built from ``policy``; both train as one ``ActorCritic``
    in the shared engine (``loop.train``), ``config.max_steps`` of ``PPOStep`` over the
    questions whose prompt fits. The reference is the policy as passed in, frozen (a resumed
    run gets the starting model again, as the stage loads it; the checkpoint restores policy
    and critic). With ``config.out_dir``: ``metrics.jsonl`` and ``checkpoints/``
    (``resume=True`` continues bit-exactly). With ``held_out`` questions, every ``eval_every``
    steps (and at the end) the row also carries ``val_accuracy`` (greedy, as GRPO's).
    """
    questions = fitting_questions(tokenizer, questions, settings)
    require_enough(questions, config, settings, "PPO")
    reference = frozen_copy(policy) if settings.kl_coef > 0 else None
    model = ActorCritic(policy, ValueModel(policy), settings.temperature)
    eval_fn = (partial(_policy_accuracy, tokenizer=tokenizer, questions=held_out,
                       settings=settings) if held_out else None)
    return train(model, questions, config, step_fn=PPOStep(tokenizer, settings, config, reference),
                 eval_fn=eval_fn, collate_fn=question_batch, resume=resume, callbacks=callbacks)


def _policy_accuracy(model: ActorCritic, *, tokenizer: BPETokenizer,
                     questions: Sequence[Question], settings: PPOSettings) -> dict[str, float]:
    return {"val_accuracy": greedy_accuracy(model.policy, tokenizer, questions, settings)}

