"""The ``agent`` stage: agentic RL on tool tasks (``training.agent_rl``, notebook 15).

``course.stages`` imports this module after its own stages, so ``agent`` registers after them.
Like ``grpo`` it is not part of ``all``: it needs a model that already calls tools (the sft
stage's, trained with the tool conversations, or the shipped reference), and it is the course's
RL branch, not a step toward the served model.
"""

from __future__ import annotations

from collections.abc import Sequence

from minimind_lib.core.atomic import read_json_lines
from minimind_lib.core.filenames import METRICS_FILE
from minimind_lib.course.profiles import Profile
from minimind_lib.course.stage_data import training_data
from minimind_lib.course.stage_eval import profile_eval, rl_summary, start_eval, write_eval
from minimind_lib.course.stage_registry import StageContext, register
from minimind_lib.data.readers import dataset_files, read_jsonl
from minimind_lib.evaluation.model_eval import eval_report
from minimind_lib.evaluation.questions import eval_files
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.training.agent_rl import solved_rate, train_agent
from minimind_lib.training.agent_rollout import AgentTask, agent_task
from minimind_lib.training.settings import TrainConfig


def select_kinds(tasks: Sequence[AgentTask], spec: str) -> list[AgentTask]:
    """The tasks whose kind is in the comma-separated ``spec`` (``"all"``: every task); an
    unknown kind is an error naming the known ones.

    >>> ts = [AgentTask([], [], ["1"], kind="weekday"), AgentTask([], [], ["2"], kind="calculate")]
    >>> [t.kind for t in select_kinds(ts, "calculate")], len(select_kinds(ts, "all"))
    (['calculate'], 2)
    """
    if spec.strip() == "all":
        return list(tasks)
    wanted = {k.strip() for k in spec.split(",") if k.strip()}
    known = {t.kind for t in tasks}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"agent.tasks: unknown kind {unknown[0]!r}; the records' kinds are "
                         f"{', '.join(sorted(known))} (or 'all')")
    return [t for t in tasks if t.kind in wanted]


def agent_tasks(profile: Profile) -> list[AgentTask]:
    """The profile's agent-RL tasks: MiniMind's ``agent_rl.jsonl`` (or ``agent_rl_math.jsonl``)
    in ``$MINIMIND_DATA_DIR`` when set, else the bundled ``data/agent_rl.jsonl``; kinds as
    ``profile.agent.tasks`` says, at most ``max_examples``."""
    tasks = [agent_task(r, f"{path}:{i}")
             for path in dataset_files("agent_rl", profile.data_dir)
             for i, r in enumerate(read_jsonl(path, "agent_rl"), start=1)]
    settings = profile.agent
    chosen = select_kinds(tasks, settings.tasks if any(t.kind != "agent" for t in tasks)
                          else "all")  # MiniMind's records carry no kind: all of them
    return chosen[:settings.max_examples] if settings.max_examples else chosen


def held_out_tasks(per_kind: int, kinds: str) -> list[AgentTask]:
    """The held-out tool questions (``data/eval/tools_eval.jsonl``) that need a tool, the first
    ``per_kind`` of each kind in ``kinds``, as tasks (greedy episodes score them)."""
    tasks, seen = [], {}
    for path in eval_files("tools"):
        for i, r in enumerate(read_jsonl(path, "sft"), start=1):
            if r.get("call") and (kinds == "all" or r["tool_task"] in kinds.split(",")):
                seen[r["tool_task"]] = seen.get(r["tool_task"], 0) + 1
                if seen[r["tool_task"]] <= per_kind:
                    tasks.append(agent_task(r, f"{path}:{i}"))
    return tasks


def solved_table(rates: dict[str, dict[str, float]], n: dict[str, int]) -> str:
    """Before -> after episode exact match per kind, as markdown.

    >>> print(solved_table({"sft": {"all": 0.1, "x": 0.1}, "agent": {"all": 0.3, "x": 0.3}},
    ...                    {"all": 10, "x": 10}))
    | tasks | n | sft | agent |
    |---|---:|---:|---:|
    | all | 10 | 10.0% | 30.0% |
    | x | 10 | 10.0% | 30.0% |
    """
    names = list(rates)
    lines = ["| tasks | n | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for kind in rates[names[0]]:
        lines.append(f"| {kind} | {n[kind]} | "
                     + " | ".join(f"{rates[m][kind]:.1%}" for m in names) + " |")
    return "\n".join(lines)


@register("agent", requires=("tokenizer", "sft"), starts_from="sft",
          sources=training_data("agent_rl"), serves=True, in_all=False, settings="agent",
          evaluates=True, title="Agentic RL", curves=("reward", "solved", "kl", "calls"),
          validation="val_solved: the share of held-out tool tasks whose greedy episode ends in "
                     "the exact answer",
          training="the policy loss (agent.loss: CISPO or GRPO) of each step's episodes, on the "
                   "model's own tokens (tool observations masked)",
          description="agentic RL: multi-turn episodes with the course's tools, rewarded by "
                      "checkable outcomes (answer, valid calls, balanced tags, finished), "
                      "GRPO or CISPO with a KL to the start; evaluates before and after")
def agent_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (sft, or ``--init DIR``) -> the RL-trained policy in ``ctx.out_dir``
    (``metrics.jsonl``: reward and its terms, solved, calls, kl per step; ``eval.json``: the
    held-out questions and text perplexity before and after, and the held-out tool tasks'
    episode exact match (``agent_solved``))."""
    profile, settings = ctx.profile, ctx.profile.agent
    tokenizer = ctx.tokenizer()
    policy = load_model(ctx.start_dir())
    tasks = agent_tasks(profile)
    held_out = held_out_tasks(profile.eval_per_task, settings.tasks)
    solved = {"start": solved_rate(policy, tokenizer, held_out, settings)}
    before = start_eval(ctx, policy, tokenizer)
    print(f"agent: {len(tasks):,} tasks, {len(held_out)} held out; solved before: "
          f"{solved['start']['all']:.1%}")
    config = TrainConfig.from_stage(settings, profile.train, out_dir=ctx.out_dir,
                                    precision=ctx.precision, device=ctx.device, seed=profile.seed,
                                    progress=ctx.progress)
    train_agent(policy, tokenizer, tasks, settings, config, resume=ctx.resume,
                held_out=held_out[::max(1, len(held_out) // 50)], callbacks=ctx.callbacks)
    rows = read_json_lines(ctx.out_dir / METRICS_FILE)  # every step, also those before a resume
    policy = policy.cpu()
    save_model(policy, ctx.out_dir)
    solved["agent"] = solved_rate(policy, tokenizer, held_out, settings)
    evals = {"start": before, "agent": profile_eval(policy, tokenizer, profile, ctx.progress)}
    counts = {"all": len(held_out)} | {k: sum(t.kind == k for t in held_out)
                                       for k in solved["start"] if k != "all"}
    write_eval(ctx.out_dir, profile.eval_per_task, evals, tasks=settings.tasks,
               loss=settings.loss, agent_solved=solved, agent_n=counts)
    print("held-out tool tasks, greedy episodes (exact final answer)\n"
          + solved_table(solved, counts) + "\n\nheld-out questions\n" + eval_report(evals))
    return {**rl_summary(rows, evals), "tasks": len(tasks),
            "solved": {n: s["all"] for n, s in solved.items()}}
