"""Agentic RL: GRPO and CISPO on multi-turn tool episodes (notebook 15).

The model is offered tools and a task; it writes turns, calls tools, reads their results and
answers (``training.agent_rollout``). Each task is rolled out ``group_size`` times; each episode
earns a reward computed from what can be checked (``agent_reward``), the group is its own
baseline (``grpo.group_advantages``), and the policy is updated on the model's own tokens only
(the response mask: observations are labelled -100) with GRPO's clipped ratio or CISPO's
clipped, detached importance weight (``grpo.grpo_loss(loss=...)``), plus the k3 KL to the
frozen starting model. The step is ``grpo.GRPOStep`` with another sampler: the engine, the
batches, the losses, the logging and the bit-exact resume are GRPO's.

**The reward, term by term** (weights in ``AgentRewardWeights``; MiniMind's ``train_agent.py``
scores the same kinds of things, with its own weights and clipping):

=============  ======  =====================================================================
term           weight  when
=============  ======  =====================================================================
``answer``     +1.0    times the share of ``gt`` values the final answer contains (a number
                       equal as a number, else the text, case-insensitive)
``exact``      +1.0    the final answer equals the record's exact ``answer`` (when it has one)
``grounded``   +0.5    the final answer contains the result of a call that ran (it uses what
                       the tool said instead of making a number up)
``faithful``   +0.5    every call ran, and every argument it passed is written in the user's
                       messages (numbers as numbers, text ignoring spaces): copied, not made up
``calls``      +0.5    as many calls ran as the task has ``gt`` values (one result each), none
                       failed; else -0.5 x the gap: ``|ran - len(gt)|`` plus the calls that
                       could not be read, named a tool not offered, or failed (MiniMind's
                       tool-count term)
``tags``       -0.25   per turn whose ``<tool_call>``/``</tool_call>`` or ``<think>``/
                       ``</think>`` do not pair up
``unfinished`` -0.5    the episode never answered (cut by the budget, or still calling after
                       ``max_rounds`` turns)
=============  ======  =====================================================================

The final answer only counts when the episode answered. A task that needs no tool rewards not
calling one only through its answer (a call costs a round and tokens, and a wrong tool fails).
Why ``calls`` rewards the count and ``grounded`` the use: the starting model calls the right
tool but copies its arguments badly (most calls fail), and then writes an answer of its own.
Measured (8 tasks x 8 episodes a step from the shipped model), with a bonus only for valid
calls and a penalty for failed ones (no count term), calling cost more than it earned (a failed
call, or a round too many) and the policy stopped calling within 6 steps (0.72 -> 0.03 calls an
episode): the tool never got the chance to be useful. Without a call the answer is almost never
right (the held-out "without tools" column of notebook 14 is ~0).

>>> weights = AgentRewardWeights()
>>> done = Trajectory([1], [2], [1], ["<tool_call>x</tool_call>", "19"], [{"name": "calculate",
...     "arguments": {}, "result": "{}", "valid": True}], [], answered=True, final="19")
>>> agent_reward(done, AgentTask([], [], ["19"], "19"), weights)  # answer, exact, faithful, calls
3.0
>>> done.calls[0]["result"] = '{"result": "19"}'                   # the tool's own number
>>> agent_reward(done, AgentTask([], [], ["19"], "19"), weights)  # ... and grounded
3.5
>>> agent_reward(Trajectory([1], [2], [1], ["<tool_call>"]), AgentTask([], [], ["19"]), weights)
-1.25
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from minimind_lib.evaluation.questions import exact_match
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.special import THINK, THINK_END, TOOL_CALL, TOOL_CALL_END
from minimind_lib.training.agent_rollout import AgentTask, Trajectory, rollout_agent
from minimind_lib.training.grpo import (
    GRPOStep,
    PolicySettings,
    Rollout,
    group_advantages,
    question_batch,
    require_enough,
)
from minimind_lib.training.logprobs import frozen_copy
from minimind_lib.training.loop import train
from minimind_lib.training.settings import TrainConfig, require_positive

# --- 1. the reward ------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentRewardWeights:
    """The weight of each reward term (the table in the module docstring)."""

    answer: float = 1.0
    exact: float = 1.0
    grounded: float = 0.5
    faithful: float = 0.5
    calls: float = 0.5
    tags: float = 0.25
    unfinished: float = 0.5


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w.])")


def contains(text: str, value: str) -> bool:
    """Whether ``text`` holds ``value``: a number as a number (``1,200`` and ``1200.0`` hold
    ``1200``), anything else as text, case-insensitive.

    >>> contains("It is 1,200.0 km", "1200"), contains("Paris", "paris"), contains("120", "12")
    (True, True, False)
    """
    value = value.strip()
    if not value:
        return False
    if re.fullmatch(r"[-+]?\d+(?:\.\d+)?", value.replace(",", "")):
        numbers = [float(n) for n in _NUMBER.findall(text.replace(",", ""))]
        return any(abs(n - float(value.replace(",", ""))) < 1e-6 for n in numbers)
    return value.lower() in text.lower()


def result_value(result: str) -> str:
    """The value of a tool's JSON result (``{"result": ...}``), as text ('' for an error).

    >>> result_value('{"result": 12}'), result_value('{"error": "no"}')
    ('12', '')
    """
    value = json.loads(result).get("result", "")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def faithful(arguments: dict, task: AgentTask) -> bool:
    """Every argument value is written in the task's user messages: a number as a number, text
    with spaces ignored (``243+99*53`` is in "Compute 243 + 99 * 53.").

    >>> t = AgentTask([{"role": "user", "content": "Compute 243 + 99 * 53."}], [], ["5490"])
    >>> faithful({"expression": "243+99*53"}, t), faithful({"expression": "243 + 9 * 53"}, t)
    (True, False)
    """
    said = " ".join(m["content"] for m in task.messages if m["role"] == "user")
    squeezed = "".join(said.split())
    for value in arguments.values():
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return False
        text = str(value).strip()
        if isinstance(value, int | float) or re.fullmatch(r"[-+]?\d+(?:\.\d+)?", text):
            if not contains(said, text):
                return False
        elif not text or "".join(text.split()) not in squeezed:
            return False
    return True


def unbalanced(turn: str) -> int:
    """1 when a turn's call or think markers do not pair up, else 0.

    >>> unbalanced("<tool_call>{}</tool_call>"), unbalanced("<tool_call>{}")
    (0, 1)
    """
    return int(turn.count(TOOL_CALL) != turn.count(TOOL_CALL_END)
               or turn.count(THINK) != turn.count(THINK_END))


def reward_terms(episode: Trajectory, task: AgentTask,
                 weights: AgentRewardWeights) -> dict[str, float]:
    """Each term of ``agent_reward``, weighted (0 where it does not apply)."""
    final = episode.final if episode.answered else ""
    ran = sum(c["valid"] for c in episode.calls)
    gap = abs(ran - len(task.gt)) + len(episode.calls) - ran + len(episode.errors)
    return {
        "answer": weights.answer * (sum(contains(final, g) for g in task.gt) / len(task.gt)
                                    if task.gt else 0.0),
        "exact": weights.exact * (task.answer is not None and episode.answered
                                  and exact_match(final, task.answer)),
        "grounded": weights.grounded * any(contains(final, result_value(c["result"]))
                                           for c in episode.calls if c["valid"]),
        "faithful": weights.faithful * (bool(episode.calls) and ran == len(episode.calls)
                                        and all(faithful(c["arguments"], task)
                                                for c in episode.calls)),
        "calls": weights.calls * (1.0 if gap == 0 else -gap),
        "tags": -weights.tags * sum(unbalanced(t) for t in episode.replies),
        "unfinished": -weights.unfinished * (not episode.answered),
    }


def agent_reward(episode: Trajectory, task: AgentTask, weights: AgentRewardWeights) -> float:
    """An episode's reward: the sum of ``reward_terms``."""
    return round(sum(reward_terms(episode, task, weights).values()), 6)


def solved(episode: Trajectory, task: AgentTask) -> bool:
    """The held-out measure: the episode answered, and the answer equals the record's
    ``answer`` (exact match) or, without one, holds every ``gt`` value (none: it answered)."""
    if not episode.answered:
        return False
    if task.answer is not None:
        return exact_match(episode.final, task.answer)
    return all(contains(episode.final, g) for g in task.gt)


# --- 2. settings, the rollout round, the step ---------------------------------------------


@dataclass(frozen=True)
class AgentSettings(PolicySettings):
    """An agentic RL run: ``PolicySettings`` (group size, clipping, KL, ``loss``: ``"cispo"``
    by default, as MiniMind's ``train_agent.py``) plus the episode's limits and the reward's
    weights. ``max_new_tokens`` is each turn's budget; ``seq_len`` caps a whole episode."""

    loss: str = "cispo"
    # measured on 24 training tasks x 4 episodes from the shipped model: at T = 1 a call's
    # arguments were copied right in 1% of episodes and 37% of calls ran; at 0.5, 5% and 74%
    # (MiniMind samples at 0.8). The policy trained is softmax(logits / T), as GRPO's.
    temperature: float = 0.5
    max_new_tokens: int = 96
    max_rounds: int = 3  # turns an episode may write (a call and its answer need 2)
    weights: AgentRewardWeights = field(default_factory=AgentRewardWeights)
    # which tasks (``tool_task`` of the records; "all": every one)
    tasks: str = "calculate,convert_units,days_between,weekday,poem_author"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "max_rounds")


@dataclass
class AgentRollout(Rollout):
    """A sampling round of episodes: ``groups`` hold ``Trajectory``s, ``questions`` the tasks,
    ``terms`` each reward term's mean over the episodes."""

    terms: dict[str, float] = field(default_factory=dict)

    def stats(self) -> dict[str, float]:
        """The round's metrics: mean ``reward`` and its terms (``reward_<term>``), ``solved``
        (share of episodes solved), ``answered``, ``calls`` (per episode), ``valid_calls``
        (share of calls that ran), ``response_length`` (sampled tokens per episode),
        ``turns`` and ``signal`` (share of groups whose rewards differ)."""
        pairs = [(e, t) for t, g in zip(self.questions, self.groups, strict=True) for e in g]
        n, calls = len(pairs), [c for e, _ in pairs for c in e.calls]
        out = {"reward": self.rewards.mean().item(),
               "solved": sum(solved(e, t) for e, t in pairs) / n,
               "answered": sum(e.answered for e, _ in pairs) / n,
               "calls": len(calls) / n,
               "valid_calls": sum(c["valid"] for c in calls) / max(len(calls), 1),
               "response_length": sum(sum(e.mask) for e, _ in pairs) / n,
               "turns": sum(len(e.replies) for e, _ in pairs) / n,
               "signal": (self.rewards.std(dim=1) > 0).float().mean().item()}
        return out | {f"reward_{name}": value for name, value in self.terms.items()}


def agent_rollout(model: nn.Module, tokenizer: BPETokenizer, tasks: Sequence[AgentTask],
                  settings: AgentSettings, generator: torch.Generator | None = None,
                  group_size: int | None = None) -> AgentRollout:
    """Roll out every task ``group_size`` times (default: the settings'), reward the episodes,
    normalise within groups."""
    k = group_size or settings.group_size
    groups = rollout_agent(model, tokenizer, tasks, k, max_rounds=settings.max_rounds,
                           max_new_tokens=settings.max_new_tokens,
                           temperature=settings.temperature, seq_len=settings.seq_len,
                           generator=generator)
    terms = [[reward_terms(e, t, settings.weights) for e in g]
             for t, g in zip(tasks, groups, strict=True)]
    rewards = torch.tensor([[round(sum(x.values()), 6) for x in row] for row in terms])  # (P, k)
    advantages = (group_advantages(rewards, settings.scale_rewards) if k > 1
                  else torch.zeros_like(rewards))  # one episode a task: no group, no baseline
    flat = [x for row in terms for x in row]
    means = {name: sum(x[name] for x in flat) / len(flat) for name in flat[0]} if flat else {}
    return AgentRollout(list(tasks), groups, rewards, advantages, means)


class AgentStep(GRPOStep):
    """``GRPOStep`` whose sampling round rolls out tool episodes (``agent_rollout``)."""

    desc = "agent"

    def sample(self, model: nn.Module, prompts: list, generator: torch.Generator) -> Rollout:
        return agent_rollout(model, self.tokenizer, prompts, self.settings, generator)

    @staticmethod
    def postfix(row: dict) -> dict[str, str]:
        return {"reward": f"{row['reward']:.3f}", "solved": f"{row['solved']:.2f}",
                "kl": f"{row.get('kl', 0.0):.4f}"}


# --- 3. training and the held-out measure --------------------------------------------------


def fitting_tasks(tokenizer: BPETokenizer, tasks: Sequence[AgentTask],
                  settings: AgentSettings) -> list[AgentTask]:
    """The tasks whose first prompt leaves room for one turn within ``seq_len``."""
    room = settings.seq_len - settings.max_new_tokens
    return [t for t in tasks
            if len(encode_chat(tokenizer, t.messages, True, tools=t.tools)) <= room]


def solved_by_kind(tasks: Sequence[AgentTask],
                   groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """The share of episodes ``solved``, overall (``"all"``) and per task kind."""
    by_kind: dict[str, list[bool]] = {}
    for task, group in zip(tasks, groups, strict=True):
        by_kind.setdefault(task.kind, []).extend(solved(e, task) for e in group)
    flat = [x for v in by_kind.values() for x in v]
    return {"all": sum(flat) / max(len(flat), 1)} | {k: sum(v) / len(v)
                                                      for k, v in by_kind.items()}


def solved_rate(model: nn.Module, tokenizer: BPETokenizer, tasks: Sequence[AgentTask],
                settings: AgentSettings) -> dict[str, float]:
    """One greedy episode of each task (the settings' limits): ``solved_by_kind``."""
    groups = rollout_agent(model, tokenizer, tasks, 1, max_rounds=settings.max_rounds,
                           max_new_tokens=settings.max_new_tokens, temperature=0.0,
                           seq_len=settings.seq_len)
    return solved_by_kind(tasks, groups)


def _val_solved(model: nn.Module, *, tokenizer: BPETokenizer, tasks: Sequence[AgentTask],
                settings: AgentSettings) -> dict[str, float]:
    return {"val_solved": solved_rate(model, tokenizer, tasks, settings)["all"]}


def train_agent(policy: nn.Module, tokenizer: BPETokenizer, tasks: Sequence[AgentTask],
                settings: AgentSettings, config: TrainConfig, *, resume: bool = False,
                held_out: Sequence[AgentTask] = (),
                callbacks: Sequence[Callable[[dict], None]] = ()) -> list[dict]:
    """Agentic-RL-train ``policy`` in place on ``tasks``; return this call's metrics rows
    (``train_grpo``'s contract: the reference is the policy as passed in, frozen; checkpoints
    and bit-exact resume through ``config.out_dir``; with ``held_out`` tasks, ``val_solved``
    every ``eval_every`` steps, greedy)."""
    tasks = fitting_tasks(tokenizer, tasks, settings)
    require_enough(tasks, config, settings, "agentic RL", "tasks")
    reference = frozen_copy(policy) if settings.kl_beta > 0 else None
    eval_fn = (partial(_val_solved, tokenizer=tokenizer, tasks=list(held_out),
                       settings=settings) if held_out else None)
    return train(policy, tasks, config, step_fn=AgentStep(tokenizer, settings, config, reference),
                 eval_fn=eval_fn, collate_fn=question_batch, resume=resume, callbacks=callbacks)
