"""Group Relative Policy Optimization with verifiable rewards (notebook 10).

GRPO (Shao et al. 2024, "DeepSeekMath", section 4.1) is PPO without a value network: for each
question ``q`` it samples a **group** of ``G`` answers ``o_1..o_G`` from the current policy,
scores each with a reward ``r_i`` (here: a checker, 1 for the right answer, 0 otherwise: a
*verifiable* reward, no reward model), and uses the group itself as the baseline::

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)                      (outcome advantage)

    J(theta) = E_q (1/G) sum_i (1/|o_i|) sum_t [ min(rho_it A_i, clip(rho_it, 1-eps_c, 1+eps_c) A_i)
                                                 - beta D_KL(pi_theta || pi_ref)_it ]   (eq. 3)

with ``rho_it = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)`` the ratio to the policy
that sampled the group (PPO's clipped surrogate, Schulman et al. 2017, eq. 7) and the KL to
the frozen starting model estimated per token by ``k3`` (Schulman 2020, "Approximating KL
Divergence"; DeepSeekMath eq. 4)::

    D_KL_it = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1        (>= 0, unbiased for KL(pi||pi_ref))

The pieces, one function each (each unit-tested against its formula written out, in the
style of Stanford CS336 assignment 5):

1. ``group_advantages``: rewards (P, G) -> advantages (P, G); ``scale=False`` drops the
   division by the group's std (Dr. GRPO);
2. ``clipped_surrogate``: the per-token PPO objective and where clipping is active;
3. ``kl_k3``: the per-token KL estimate;
4. ``aggregate``: per-token values -> one number, ``"sequence"`` (GRPO's ``1/|o_i|``) or
   ``"constant"`` (Dr. GRPO: sum over tokens / ``max_new_tokens``);
5. ``grpo_loss``: ``-J`` from per-token log-probs; ``GRPOLoss`` is the ``loss_fn`` the
   engine's ``loop.train_step`` calls;
6. ``GRPOStep``: the step the shared engine (``loop.train``) repeats: sample groups
   (``rollout.sample_answers``), reward them with the evaluation's checker
   (``rollout.verifiable_reward``), update; ``train_grpo`` runs it, one metrics row per step
   with ``reward``, ``kl`` and ``response_length``. The ``grpo`` stage runs that.

**Length normalisation (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training").**
GRPO's ``1/|o_i|`` gives every answer the same total weight, however long: a long *wrong*
answer (negative advantage) is penalised less per token than a short one, and a short right
answer is rewarded more per token, so the policy drifts toward long wrong answers. Dividing
by a constant (the token budget) instead weighs every token alike. Likewise the std in the
advantage up-weights questions whose groups barely disagree (nearly all right or all wrong).
Both are settings here (``length_norm``, ``scale_rewards``); with answers of a few tokens the
difference is small, which notebook 10 shows.

>>> group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale=False)
tensor([[ 0.5000, -0.5000, -0.5000,  0.5000]])
>>> kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0]))   # same log-prob: no divergence
tensor([0.])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor, nn

from minimind_lib.core.device import Precision
from minimind_lib.data.conversations import pad_sft_batch
from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import END_OF_TEXT
from minimind_lib.training.logprobs import frozen_copy, token_logprobs
from minimind_lib.training.loop import StepResult, TrainRun, train, train_step
from minimind_lib.training.rollout import (
    REWARDS,
    Question,
    Sample,
    is_correct,
    sample_answers,
    verifiable_reward,
)
from minimind_lib.training.settings import TrainConfig, TrainSettings, require_positive

LENGTH_NORMS = ("sequence", "constant")


POLICY_LOSSES = ("grpo", "cispo")


@dataclass(frozen=True)
class PolicySettings(TrainSettings):
    """What every group-sampling policy-gradient run shares (GRPO here, agentic RL in
    ``training.agent_rl``): ``batch_size`` prompts per micro-batch, each answered
    ``group_size`` times: an optimizer step sees ``batch_size * accumulation_steps`` prompts
    and ``group_size`` times as many samples. ``seq_len`` caps prompt + answer (longer prompts
    are left out); ``max_steps`` counts sampling rounds, each followed by ``policy_epochs``
    optimizer steps on its groups (``mu`` in the paper; above 1 the clipping matters).
    ``loss`` picks the policy objective: ``"grpo"`` (PPO's clipped ratio) or ``"cispo"``
    (the clipped ratio as a detached weight on the log-prob: ``cispo_objective``)."""

    group_size: int = 8  # G answers per question
    max_new_tokens: int = 16  # answer budget (the Dr. GRPO normaliser, too)
    temperature: float = 1.0  # sampling temperature; the policy trained is softmax(logits / T)
    clip_eps: float = 0.2  # PPO's clip range: the ratio is clipped to [1 - eps, 1 + eps]
    kl_beta: float = 0.04  # weight of the KL penalty to the starting model (0: none)
    loss: str = "grpo"  # "grpo": clipped ratio; "cispo": clipped, detached importance weight
    cispo_max_ratio: float = 5.0  # CISPO's upper bound on the importance weight (eps_high)
    scale_rewards: bool = True  # divide advantages by the group's std (False: Dr. GRPO)
    length_norm: str = "sequence"  # "sequence": GRPO's 1/|o_i|; "constant": Dr. GRPO
    policy_epochs: int = 1  # optimizer steps per sampled batch (mu)
    skip_flat_groups: bool = True  # update only on groups whose rewards differ (see _step)

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        require_positive(self, "group_size", "max_new_tokens", "policy_epochs")
        if self.group_size < 2:
            raise ValueError(f"{name}.group_size must be at least 2 (a group is its own "
                             f"baseline), got {self.group_size}")
        if self.temperature <= 0 or self.clip_eps <= 0 or self.kl_beta < 0:
            raise ValueError(f"{name}: temperature and clip_eps must be positive, kl_beta "
                             f">= 0 (got {self.temperature}, {self.clip_eps}, {self.kl_beta})")
        if self.loss not in POLICY_LOSSES:
            raise ValueError(f"{name}.loss is {self.loss!r}; choose one of "
                             f"{', '.join(POLICY_LOSSES)}")
        if self.cispo_max_ratio < 1:
            raise ValueError(f"{name}.cispo_max_ratio must be at least 1 (the weight of an "
                             f"unchanged token), got {self.cispo_max_ratio}")
        if self.length_norm not in LENGTH_NORMS:
            raise ValueError(f"{name}.length_norm is {self.length_norm!r}; choose one of "
                             f"{', '.join(LENGTH_NORMS)}")
        if self.max_new_tokens >= self.seq_len:
            raise ValueError(f"{name}.max_new_tokens ({self.max_new_tokens}) must be below "
                             f"seq_len ({self.seq_len}), which holds prompt and answer")


@dataclass(frozen=True)
class GRPOSettings(PolicySettings):
    """A GRPO run's hyper-parameters (``PolicySettings``) and its single-turn questions: which
    ``tasks``, and how an answer is rewarded."""

    reward: str = "exact"  # "exact": 1 for the right answer; "char_f1": partial credit
    format_reward: float = 0.0  # bonus for a finished, well-formed reply, right or wrong
    # task or family names (rollout.select_tasks)
    tasks: str = "larger_number,arithmetic,first_word"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.format_reward < 0:
            raise ValueError(f"{name}.format_reward must be >= 0, got {self.format_reward}")
        if self.reward not in REWARDS:
            raise ValueError(f"{name}.reward is {self.reward!r}; choose one of "
                             f"{', '.join(REWARDS)}")


# --- 1-5. the objective, piece by piece --------------------------------------------------------


def group_advantages(rewards: Tensor, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages (P, G) of rewards (P, G): each answer's reward minus its
    group's mean, divided by the group's standard deviation (Bessel-corrected, as
    ``torch.std``) plus ``eps`` when ``scale``. A group whose answers all earn the same reward
    gets advantage 0: it carries no signal.

    >>> group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))
    tensor([[ 1.5000, -0.5000, -0.5000, -0.5000],
            [ 0.0000,  0.0000,  0.0000,  0.0000]])
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # (P, G)
    return centred / (rewards.std(dim=1, keepdim=True) + eps) if scale else centred


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor,
                      clip_eps: float) -> tuple[Tensor, Tensor]:
    """PPO's clipped objective per token (B, T): ``min(rho A, clip(rho, 1-eps, 1+eps) A)``
    with ``rho = exp(logp - old_logp)``; ``advantages`` (B,) are per answer. Also returns
    where the clipped term is the smaller one (B, T) (bool): there the gradient is 0.

    >>> obj, clipped = clipped_surrogate(torch.log(torch.tensor([[1.5, 0.9]])),
    ...                                  torch.zeros(1, 2), torch.tensor([1.0]), clip_eps=0.2)
    >>> obj, clipped                                     # 1.5 is clipped to 1.2; 0.9 is not
    (tensor([[1.2000, 0.9000]]), tensor([[ True, False]]))
    """
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages[:, None]  # (B, 1)
    unclipped = ratio * adv  # (B, T)
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv  # (B, T)
    return torch.minimum(unclipped, clipped), clipped < unclipped


def cispo_objective(logp: Tensor, old_logp: Tensor, advantages: Tensor,
                    max_ratio: float) -> tuple[Tensor, Tensor]:
    """CISPO's objective per token (B, T) (MiniMax-M1, Chen et al. 2025, eq. 4): the importance
    ratio ``rho = exp(logp - old_logp)``, clipped above at ``max_ratio`` and **detached**, weighs
    the token's log-prob: ``sg(min(rho, max_ratio)) * A * logp``. Its gradient is
    ``min(rho, max_ratio) * A * grad logp`` on every token: unlike the clipped surrogate, a
    token whose ratio left the trust region still learns (with a bounded weight) instead of
    getting no gradient at all, which is what keeps rare, decisive tokens (a tool call's
    first token, say) in the update. Also returns where the weight was clipped (B, T).

    >>> obj, clipped = cispo_objective(torch.log(torch.tensor([[6.0, 0.5]])), torch.zeros(1, 2),
    ...                                torch.tensor([1.0]), max_ratio=5.0)
    >>> obj, clipped                     # weights 5 (clipped from 6) and 0.5, times log-probs
    (tensor([[ 8.9588, -0.3466]]), tensor([[ True, False]]))
    """
    ratio = torch.exp(logp - old_logp)  # (B, T)
    weight = ratio.clamp(max=max_ratio).detach()  # (B, T): no gradient through the weight
    return weight * advantages[:, None] * logp, ratio > max_ratio


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate from the sampled tokens' log-probs:
    ``exp(ref - logp) - (ref - logp) - 1`` (Schulman's k3; DeepSeekMath eq. 4). Non-negative,
    0 where the two log-probs agree, and unbiased: its mean over tokens sampled from pi_theta
    is the KL. Its gradient pushes ``logp`` toward ``ref_logp`` from either side.

    >>> kl_k3(torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.0]))
    tensor([0.3679, 0.7183])
    """
    log_ratio = ref_logp - logp  # log pi_ref / pi_theta
    return torch.exp(log_ratio) - log_ratio - 1


def aggregate(per_token: Tensor, mask: Tensor, length_norm: str = "sequence",
              max_new_tokens: int | None = None) -> Tensor:
    """Per-token values (B, T) -> one number, counting only ``mask``ed (answer) tokens.

    ``"sequence"`` (GRPO, eq. 3): mean over each answer's tokens, then over answers.
    ``"constant"`` (Dr. GRPO): sum over each answer's tokens divided by ``max_new_tokens``
    (the same for every answer), then the mean over answers.

    >>> x = torch.tensor([[1.0, 1.0, 0.0], [4.0, 0.0, 0.0]])
    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> aggregate(x, m), aggregate(x, m, "constant", max_new_tokens=4)
    (tensor(2.5000), tensor(0.7500))
    """
    mask = mask.to(per_token.dtype)
    sums = (per_token * mask).sum(dim=1)  # (B,)
    if length_norm == "sequence":
        return (sums / mask.sum(dim=1).clamp(min=1)).mean()
    if length_norm == "constant":
        if max_new_tokens is None:
            raise ValueError("length_norm='constant' needs max_new_tokens")
        return (sums / max_new_tokens).mean()
    raise ValueError(f"length_norm is {length_norm!r}; choose one of {', '.join(LENGTH_NORMS)}")


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor,
              mask: Tensor, *, clip_eps: float = 0.2, kl_beta: float = 0.04,
              length_norm: str = "sequence", max_new_tokens: int | None = None,
              loss: str = "grpo",
              cispo_max_ratio: float = 5.0) -> tuple[Tensor, dict[str, Tensor]]:
    """``-J(theta)`` (eq. 3) of a batch of answers: per-token log-probs (B, T) under the policy,
    the sampling policy and the reference (None: no KL term), advantages (B,) and the answer
    ``mask`` (B, T). ``loss="cispo"`` puts ``cispo_objective`` where eq. 3 has the clipped
    surrogate (the KL term and the aggregation stay). Returns the loss and detached metrics:
    ``kl`` (mean k3 per answer token), ``clip_fraction`` (share of answer tokens where clipping
    is active) and ``ratio`` (mean ``rho``)."""
    if loss == "grpo":
        objective, clipped = clipped_surrogate(logp, old_logp, advantages, clip_eps)  # (B, T)
    elif loss == "cispo":
        objective, clipped = cispo_objective(logp, old_logp, advantages, cispo_max_ratio)
    else:
        raise ValueError(f"loss is {loss!r}; choose one of {', '.join(POLICY_LOSSES)}")
    mask = mask.bool()
    n_tokens = mask.sum().clamp(min=1)
    metrics = {"clip_fraction": (clipped & mask).sum() / n_tokens,
               "ratio": (torch.exp(logp - old_logp) * mask).sum().detach() / n_tokens}
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp)  # (B, T)
        objective = objective - kl_beta * kl
        metrics["kl"] = (kl * mask).sum().detach() / n_tokens
    loss = -aggregate(objective, mask, length_norm, max_new_tokens)
    return loss, metrics


@dataclass
class GRPOLoss:
    """``loss_fn`` for ``training.loop.train_step``: ``grpo_loss`` of a ``rollout_batches`` batch.

    The batch carries ``input_ids`` / ``labels`` (answer tokens labelled), ``advantages`` (B,),
    ``ref_logps`` (B, T-1) and, after the first optimizer step on a sampled batch,
    ``old_logps``. Without ``old_logps`` the policy *is* the sampling policy: the ratio is 1
    and its gradient is ``grad log pi``, so ``logp.detach()`` stands in for a second pass."""

    clip_eps: float = 0.2
    kl_beta: float = 0.04
    length_norm: str = "sequence"
    max_new_tokens: int | None = None
    temperature: float = 1.0  # the sampling temperature: the policy is softmax(logits / T)
    loss: str = "grpo"  # or "cispo" (grpo_loss)
    cispo_max_ratio: float = 5.0

    def __call__(self, model: nn.Module, batch: dict) -> tuple[Tensor, dict[str, Tensor]]:
        logp = token_logprobs(model, batch["input_ids"], batch["labels"],
                              self.temperature)  # (B, T-1)
        old = batch["old_logps"] if "old_logps" in batch else logp.detach()
        mask = batch["labels"][:, 1:] != IGNORE_INDEX  # (B, T-1)
        return grpo_loss(logp, old, batch.get("ref_logps") if self.kl_beta > 0 else None,
                         batch["advantages"], mask, clip_eps=self.clip_eps,
                         kl_beta=self.kl_beta, length_norm=self.length_norm,
                         max_new_tokens=self.max_new_tokens, loss=self.loss,
                         cispo_max_ratio=self.cispo_max_ratio)


# --- 6. rollouts -> batches --------------------------------------------------------------------


@dataclass
class Rollout:
    """One sampling round: the questions, their groups of samples, rewards and advantages."""

    questions: list[Question]
    groups: list[list[Sample]]
    rewards: Tensor  # (P, G)
    advantages: Tensor  # (P, G)

    def stats(self) -> dict[str, float]:
        """The round's metrics: mean ``reward``, ``accuracy`` (share right), ``format_rate``,
        ``response_length`` (mean generated tokens, stop token included) and ``signal`` (share
        of groups whose rewards differ: the others have advantage 0)."""
        samples = [s for g in self.groups for s in g]
        right = [is_correct(s.answer, q.answer) for q, g in zip(self.questions, self.groups,
                                                                strict=True) for s in g]
        return {"reward": self.rewards.mean().item(), "accuracy": sum(right) / len(right),
                "format_rate": sum(s.answer.follows_format for s in samples) / len(samples),
                "response_length": sum(len(s.response) for s in samples) / len(samples),
                "signal": (self.rewards.std(dim=1) > 0).float().mean().item()}

    def with_signal(self) -> Rollout:
        """Only the groups whose rewards differ (the others have advantage 0 everywhere)."""
        keep = (self.rewards.std(dim=1) > 0).nonzero().flatten().tolist()
        return replace(self, questions=[self.questions[i] for i in keep],
                       groups=[self.groups[i] for i in keep], rewards=self.rewards[keep],
                       advantages=self.advantages[keep])


def grade(questions: Sequence[Question], groups: Sequence[Sequence[Sample]],
          format_reward: float = 0.0, kind: str = "exact") -> Tensor:
    """Each sampled answer's ``rollout.verifiable_reward``, (P, G) (PPO grades the same way)."""
    return torch.tensor([[verifiable_reward(s.answer, q.answer, format_reward, kind) for s in g]
                         for q, g in zip(questions, groups, strict=True)])


def require_enough(prompts: Sequence, config: TrainConfig, settings: TrainSettings,
                   what: str, noun: str = "questions") -> None:
    """The error when fewer ``prompts`` fit ``seq_len - max_new_tokens`` than one optimizer
    step takes (``batch_size * accumulation_steps``): GRPO's, PPO's and agentic RL's check."""
    needed = config.batch_size * config.accumulation_steps
    if len(prompts) < needed:
        raise ValueError(f"{what} needs at least {needed} {noun} whose prompt fits seq_len - "
                         f"max_new_tokens ({settings.seq_len} - {settings.max_new_tokens}); "
                         f"{len(prompts)} do")


def rollout(model: nn.Module, tokenizer: BPETokenizer, questions: Sequence[Question],
            settings: GRPOSettings, generator: torch.Generator | None = None) -> Rollout:
    """Sample ``settings.group_size`` answers per question, reward them
    (``rollout.verifiable_reward``) and normalise the rewards within each group."""
    groups = sample_answers(model, tokenizer, questions, settings.group_size,
                            max_new_tokens=settings.max_new_tokens,
                            temperature=settings.temperature, generator=generator)
    rewards = grade(questions, groups, settings.format_reward, settings.reward)  # (P, G)
    return Rollout(list(questions), groups, rewards,
                   group_advantages(rewards, settings.scale_rewards))


def rollout_batches(ro: Rollout, batch_size: int, pad_id: int) -> list[dict[str, Tensor]]:
    """The rollout as training micro-batches of ``batch_size`` questions (all their answers):
    ``input_ids`` / ``labels`` (prompt -100, answer = the sampled ids), ``advantages`` (B,)."""
    batches = []
    for start in range(0, len(ro.groups), batch_size):
        rows, advantages = [], []
        for p in range(start, min(start + batch_size, len(ro.groups))):
            for g, sample in enumerate(ro.groups[p]):
                rows.append({"input_ids": torch.tensor(sample.prompt + sample.response),
                             "labels": torch.tensor(sample.labels())})
                advantages.append(ro.advantages[p, g])
        batch = pad_sft_batch(rows, pad_id)  # (B*G, T) each
        batch["advantages"] = torch.stack(advantages).float()  # (B*G,)
        batches.append(batch)
    return batches


@torch.no_grad()
def attach_logprobs(model: nn.Module, batches: list[dict[str, Tensor]], key: str,
                    device: torch.device, precision: Precision, temperature: float = 1.0) -> None:
    """Store ``model``'s per-token log-probs of every batch under ``key`` (``ref_logps`` from
    the frozen reference, ``old_logps`` from the policy before its updates)."""
    was_training = model.training
    model.to(device).eval()
    for batch in batches:
        with precision.context(device):
            logps = token_logprobs(model, batch["input_ids"].to(device),
                                   batch["labels"].to(device), temperature)
        batch[key] = logps.float()
    model.train(was_training)


# --- 7. the step the engine repeats -------------------------------------------------------------


def fitting_questions(tokenizer: BPETokenizer, questions: Sequence[Question],
                      settings: GRPOSettings) -> list[Question]:
    """The questions whose prompt leaves room for ``max_new_tokens`` within ``seq_len``."""
    room = settings.seq_len - settings.max_new_tokens
    return [q for q in questions
            if len(encode_chat(tokenizer, q.messages, add_generation_prompt=True)) <= room]


def question_batch(questions: list[Question]) -> list[Question]:
    """The ``collate_fn`` of a question stream: a micro-batch is the list of its questions."""
    return questions


class GRPOStep:
    """The engine's step for GRPO (``loop.BatchStep``'s sibling): one sampling round and its
    ``policy_epochs`` optimizer steps.

    It takes the next ``batch_size * accumulation_steps`` questions of the run's stream (the
    engine orders questions as it orders any dataset: a seeded permutation per pass), samples a
    group of answers per question with the current policy (a generator seeded by (seed, step),
    so a resumed run samples exactly what an uninterrupted one would), rewards and normalises
    them, scores them under the frozen ``reference``, then runs ``loop.train_step`` on them
    ``policy_epochs`` times. ``train`` does the rest: learning rate, logging, validation,
    checkpoints and bit-exact resume (RNG states included)."""

    desc = "grpo"

    def __init__(self, tokenizer: BPETokenizer, settings: PolicySettings, config: TrainConfig,
                 reference: nn.Module | None) -> None:
        self.tokenizer, self.settings, self.reference = tokenizer, settings, reference
        self.seed, self.grad_clip = config.seed, config.grad_clip
        self.batch_size, self.accumulation_steps = config.batch_size, config.accumulation_steps
        self.loss_fn = GRPOLoss(settings.clip_eps, settings.kl_beta, settings.length_norm,
                                settings.max_new_tokens, settings.temperature, settings.loss,
                                settings.cispo_max_ratio)

    def sample(self, model: nn.Module, prompts: list, generator: torch.Generator) -> Rollout:
        """One sampling round's groups, rewards and advantages (agentic RL overrides this)."""
        return rollout(model, self.tokenizer, prompts, self.settings, generator)

    def __call__(self, run: TrainRun, step: int) -> StepResult:
        if run.info.world_size > 1:
            raise ValueError(f"{self.desc} runs in one process (its rollouts are not split "
                             "across ranks); start it without torchrun")
        settings, t0 = self.settings, time.perf_counter()
        questions = [q for _ in range(self.accumulation_steps) for q in next(run.batches)]
        generator = torch.Generator(run.device).manual_seed(self.seed * 1_000_003 + step)
        with run.precision.context(run.device):
            ro = self.sample(run.model, questions, generator)
        # subtle: a group whose answers all earn the same reward has advantage 0: its only
        # gradient is the KL term's, which is ~0 near the reference. Skipping such groups (DAPO's
        # "dynamic sampling" without the resampling) saves most of an update when the policy
        # is mostly right
        kept = ro.with_signal() if settings.skip_flat_groups else ro
        trained = kept if kept.groups else ro
        batches = rollout_batches(trained, self.batch_size,
                                  self.tokenizer.token_to_id(END_OF_TEXT))
        if self.reference is not None:
            attach_logprobs(self.reference, batches, "ref_logps", run.device, run.precision,
                            settings.temperature)
        if settings.policy_epochs > 1:  # pi_old: the policy that sampled, before any update
            attach_logprobs(run.model, batches, "old_logps", run.device, run.precision,
                            settings.temperature)
        t1 = time.perf_counter()
        results = [train_step(run.forward, iter(batches), run.optimizer, run.scaler, run.params,
                              self.loss_fn, accumulation_steps=len(batches),
                              grad_clip=self.grad_clip, precision=run.precision,
                              device=run.device)
                   for _ in range(settings.policy_epochs)]
        values = {k: sum(r.values[k] for r in results) / len(results) for k in results[0].values}
        return StepResult({**ro.stats(), **values, "trained_groups": len(trained.groups),
                           "sample_s": t1 - t0, "update_s": time.perf_counter() - t1},
                          sum(r.tokens for r in results), all(r.finite for r in results))

    @staticmethod
    def postfix(row: dict) -> dict[str, str]:
        return {"reward": f"{row['reward']:.3f}", "kl": f"{row.get('kl', 0.0):.4f}",
                "length": f"{row['response_length']:.1f}"}


def train_grpo(policy: nn.Module, tokenizer: BPETokenizer, questions: Sequence[Question],
               settings: GRPOSettings, config: TrainConfig, *, resume: bool = False,
               held_out: Sequence[Question] = (),
               callbacks: Sequence[Callable[[dict], None]] = ()) -> list[dict]:
    """GRPO-train ``policy`` in place on ``questions``; return this call's metrics rows.

    The shared engine (``loop.train``) runs ``config.max_steps`` of ``GRPOStep`` over the
    questions whose prompt fits. The reference is the policy as it is passed in, frozen: a
    resumed run gets the starting model again (as the stage loads it), so the reference is the
    original one. With ``config.out_dir``: rows go to ``metrics.jsonl``, checkpoints to
    ``checkpoints/`` (``resume=True`` continues bit-exactly). With ``held_out`` questions, every
    ``eval_every`` steps (and at the end) the row also carries ``val_accuracy``: the share
    answered right greedily, as the evaluation answers.
    """
    questions = fitting_questions(tokenizer, questions, settings)
    require_enough(questions, config, settings, "GRPO")
    reference = frozen_copy(policy) if settings.kl_beta > 0 else None
    eval_fn = (partial(_greedy_accuracy, tokenizer=tokenizer, questions=held_out,
                       settings=settings) if held_out else None)
    return train(policy, questions, config, step_fn=GRPOStep(tokenizer, settings, config,
                                                             reference),
                 eval_fn=eval_fn, collate_fn=question_batch, resume=resume, callbacks=callbacks)


def greedy_accuracy(model: nn.Module, tokenizer: BPETokenizer, questions: Sequence[Question],
                    settings: GRPOSettings) -> float:
    """Share of ``questions`` the model answers right greedily (its evaluation answers)."""
    answers = sample_answers(model, tokenizer, questions, 1,
                             max_new_tokens=settings.max_new_tokens, temperature=0.0)
    return sum(is_correct(a[0].answer, q.answer)
               for a, q in zip(answers, questions, strict=True)) / len(questions)


def _greedy_accuracy(model: nn.Module, *, tokenizer: BPETokenizer, questions: Sequence[Question],
                     settings: GRPOSettings) -> dict[str, float]:
    return {"val_accuracy": greedy_accuracy(model, tokenizer, questions, settings)}
