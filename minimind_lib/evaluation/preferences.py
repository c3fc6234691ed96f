"""Preference accuracy on held-out pairs (notebook 06): does a model give its chosen answer a
higher reward than the rejected one? ``score_preferences`` per task and family, with the
summary rows and table the DPO stage reports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

# --- preference accuracy (notebook 06) ---------------------------------------------------


@dataclass(frozen=True)
class PreferenceScores:
    """Held-out preference accuracy of one task (or a family / "all") over ``n`` pairs.

    ``logprob_accuracy``: share of pairs where the model gives the chosen answer a higher
    summed log-probability than the rejected one (any model: SFT or DPO). ``reward_accuracy``:
    share where DPO's implicit reward ``beta log pi/pi_ref`` is higher for the chosen answer,
    i.e. the policy raised the chosen answer's log-prob more (or lowered it less) than the
    rejected one's, relative to the reference (None without reference log-probs; ``beta > 0``
    does not change the sign). Ties count as wrong.
    """

    task: str
    family: str
    n: int
    logprob_accuracy: float
    reward_accuracy: float | None


def score_preferences(tasks: Sequence[str | None], families: Sequence[str | None],
                      policy_logps: torch.Tensor,
                      reference_logps: torch.Tensor | None = None) -> dict[str, PreferenceScores]:
    """Per-task preference accuracy from (N, 2) log-probs ``[chosen, rejected]`` of every pair
    (``minimind_lib.training.dpo.pair_logprobs``); tasks in first-seen order, None counted as "all".

    >>> logps = torch.tensor([[-1.0, -2.0], [-3.0, -2.0], [-1.0, -5.0]])
    >>> ref = torch.tensor([[-1.0, -1.0], [-4.0, -1.0], [-1.0, -1.0]])
    >>> s = score_preferences(["a", "a", "b"], ["skill"] * 3, logps, ref)
    >>> s["a"].logprob_accuracy, s["a"].reward_accuracy, s["b"].n
    (0.5, 1.0, 1)
    """
    n = len(tasks)
    if policy_logps.shape != (n, 2) or len(families) != n:
        raise ValueError(f"{n} tasks, {len(families)} families and policy log-probs of shape "
                         f"{tuple(policy_logps.shape)}: expected (N, 2) for N pairs")
    if reference_logps is not None and reference_logps.shape != policy_logps.shape:
        raise ValueError(f"reference log-probs {tuple(reference_logps.shape)} do not match the "
                         f"policy's {tuple(policy_logps.shape)}")
    by_logprob = (policy_logps[:, 0] > policy_logps[:, 1]).tolist()
    by_reward = None
    if reference_logps is not None:
        ratio = policy_logps - reference_logps  # (N, 2): log pi/pi_ref of chosen, rejected
        by_reward = (ratio[:, 0] > ratio[:, 1]).tolist()
    rows: dict[str, list[int]] = defaultdict(list)
    family: dict[str, str] = {}
    for i, (task, fam) in enumerate(zip(tasks, families, strict=True)):
        rows[task or "all"].append(i)
        family[task or "all"] = fam or "unknown"
    return {task: PreferenceScores(
                task, family[task], len(idx), sum(by_logprob[i] for i in idx) / len(idx),
                None if by_reward is None else sum(by_reward[i] for i in idx) / len(idx))
            for task, idx in rows.items()}


def summarize_preferences(results: Mapping[str, PreferenceScores]) -> dict[str, PreferenceScores]:
    """Pair-weighted means per family and over all tasks: keys "skill", "knowledge" (those
    present) and "all".

    >>> s = summarize_preferences({"a": PreferenceScores("a", "skill", 1, 1.0, None),
    ...                            "b": PreferenceScores("b", "knowledge", 3, 0.0, None)})
    >>> s["all"].logprob_accuracy, s["all"].n, s["all"].reward_accuracy
    (0.25, 4, None)
    """
    def pool(name: str, rows: list[PreferenceScores]) -> PreferenceScores:
        n = sum(r.n for r in rows)
        logprob = sum(r.logprob_accuracy * r.n for r in rows) / n
        has_reward = all(r.reward_accuracy is not None for r in rows)
        reward = sum(r.reward_accuracy * r.n for r in rows) / n if has_reward else None
        return PreferenceScores(name, name, n, logprob, reward)

    out = {}
    for fam in dict.fromkeys(r.family for r in results.values()):
        out[fam] = pool(fam, [r for r in results.values() if r.family == fam])
    out["all"] = pool("all", list(results.values()))
    return out


def preference_table(results: Mapping[str, Mapping[str, PreferenceScores]]) -> str:
    """A markdown table comparing models' preference accuracy, per task, family and "all":
    one log-prob accuracy column per model, then an implicit-reward column per model that has
    a reference. ``results`` maps a model name to its ``score_preferences`` output.

    >>> r = {"t": PreferenceScores("t", "skill", 4, 0.5, None)}
    >>> d = {"t": PreferenceScores("t", "skill", 4, 0.75, 1.0)}
    >>> print(preference_table({"SFT": r, "DPO": d}))
    | task | family | n | log-prob acc. SFT | log-prob acc. DPO | reward acc. DPO |
    |---|---|---:|---:|---:|---:|
    | t | skill | 4 | 50.0% | 75.0% | 100.0% |
    | **skill** |  | 4 | 50.0% | 75.0% | 100.0% |
    | **all** |  | 4 | 50.0% | 75.0% | 100.0% |
    """
    tables = {name: {**res, **{f"**{k}**": v for k, v in summarize_preferences(res).items()}}
              for name, res in results.items()}
    with_reward = [name for name, res in results.items()
                   if all(r.reward_accuracy is not None for r in res.values())]
    head = (["task", "family", "n"] + [f"log-prob acc. {name}" for name in tables]
            + [f"reward acc. {name}" for name in with_reward])
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for key, row in next(iter(tables.values())).items():
        cells = [key, "" if key.startswith("**") else row.family, str(row.n)]
        cells += [f"{t[key].logprob_accuracy:.1%}" if key in t else "-" for t in tables.values()]
        cells += [f"{tables[name][key].reward_accuracy:.1%}" if key in tables[name] else "-"
                  for name in with_reward]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
