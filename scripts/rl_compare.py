"""GRPO, CISPO and PPO at the same budget: what each gains, and what it costs.

Every arm starts from the shipped chat model (``data/reference/sft``, the cpu profile's SFT,
fp32), with the profile's seed, on the same training questions
(``stage_data.training_questions``, the grpo stage's), for the same steps of the same batch
(``batch_size`` questions x ``group_size`` sampled answers a step):

* ``grpo``: ``profile.grpo`` (the clipped ratio, ``loss="grpo"``);
* ``cispo``: ``profile.grpo`` with only ``loss="cispo"`` (the clipped ratio as a detached
  weight on the log-prob);
* ``ppo``: ``profile.ppo`` (per-token advantages from a learned critic, GAE).

With one optimizer step per sampled batch (``policy_epochs`` 1, the cpu profile's) the policy
being trained is the one that sampled: the ratio is exactly 1, nothing is clipped, and GRPO's
and CISPO's gradients are the same (``A grad log pi``), so those two arms can differ only by
rounding. ``--policy-epochs 2`` (both arms) gives the second update on each batch, where the
ratio has moved and the two objectives part.

Measured per arm: the mean training reward over the first and the last fifth of the steps;
greedy exact match on held-out questions of the same tasks before and after
(``grpo.greedy_accuracy`` on ``--per-task`` evaluation questions per task, the profile's
``eval_per_task`` unless given); the KL to the starting model at the end (the mean of the last
fifth of the ``kl`` column: GRPO's k3 in the loss, PPO's k3 of the sampled tokens); the wall
time of training alone (no evaluation inside it: ``eval_every`` and ``save_every`` are set to
the steps); and the peak resident memory of the arm, each arm running in its own process
(``ru_maxrss`` of that process: the model, the reference copy, PPO's critic, the optimizer
and the rollouts; about 0.25 GiB of it is Python, torch and the loaded model alone).

Usage: ``python scripts/rl_compare.py [--profile cpu] [--steps N] [--arms grpo,cispo,ppo]
[--policy-epochs M] [--json out.json]`` (1 torch thread; at the cpu profile's 16 x 8 a step,
about 2 s a step for GRPO and CISPO and about 8 s for PPO on this CPU, plus about a minute of
held-out evaluation per arm). The arms run one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("grpo", "cispo", "ppo")


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def run_arm(arm: str, profile_name: str, steps: int | None, per_task: int | None,
            policy_epochs: int | None = None) -> dict:
    """Train one arm in this process and return its measurements."""
    import torch

    from minimind_lib import DATA_DIR
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stage_data import training_questions
    from minimind_lib.evaluation.questions import load_eval_records, select_per_task
    from minimind_lib.inference.loading import load_model
    from minimind_lib.tokenizer import load_tokenizer
    from minimind_lib.training import TrainConfig
    from minimind_lib.training.grpo import greedy_accuracy, train_grpo
    from minimind_lib.training.ppo import train_ppo
    from minimind_lib.training.rollout import verifiable_questions

    torch.set_num_threads(1)
    profile = get_profile(profile_name)
    if arm == "ppo":
        settings, train_fn = profile.ppo, train_ppo
    else:
        settings, train_fn = replace(profile.grpo, loss=arm), train_grpo
        if policy_epochs is not None:
            settings = replace(settings, policy_epochs=policy_epochs)
    if steps is not None:
        settings = replace(settings, max_steps=steps)
    # no evaluation or checkpoint inside the timed run
    settings = replace(settings, eval_every=settings.max_steps, save_every=settings.max_steps)
    reference = DATA_DIR / "reference" / "sft"
    policy = load_model(reference).float()
    tokenizer = load_tokenizer(reference / "tokenizer.json")
    questions, _ = training_questions(profile, settings.tasks, None, "grpo")
    held_out = verifiable_questions(
        select_per_task(load_eval_records(), per_task or profile.eval_per_task), settings.tasks)
    before = greedy_accuracy(policy, tokenizer, held_out, settings)
    config = TrainConfig.from_stage(settings, out_dir=None, precision="fp32", device="cpu",
                                    seed=profile.seed, progress=False)
    start = time.perf_counter()
    rows = train_fn(policy, tokenizer, questions, settings, config)
    wall = time.perf_counter() - start
    policy = policy.cpu()
    after = greedy_accuracy(policy, tokenizer, held_out, settings)
    fifth = max(1, len(rows) // 5)

    def mean(key: str, part: list[dict]) -> float:
        values = [r[key] for r in part if key in r]
        return sum(values) / len(values) if values else float("nan")

    name = arm if arm == "ppo" or policy_epochs is None else f"{arm} (mu {policy_epochs})"
    return {"arm": name, "steps": len(rows), "questions": len(questions),
            "held_out": len(held_out), "batch_size": settings.batch_size,
            "group_size": settings.group_size, "tasks": settings.tasks,
            "learning_rate": settings.learning_rate, "seed": profile.seed,
            "reward_first_fifth": mean("reward", rows[:fifth]),
            "reward_last_fifth": mean("reward", rows[-fifth:]),
            "kl_last_fifth": mean("kl", rows[-fifth:]),
            "held_out_before": before, "held_out_after": after,
            "wall_s": wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def table(results: list[dict]) -> str:
    lines = ["| arm | reward first fifth -> last fifth | held-out exact match before -> after "
             "(points) | KL | wall time s | peak RSS MiB |",
             "|---|---|---|---:|---:|---:|"]
    for r in results:
        points = 100 * (r["held_out_after"] - r["held_out_before"])
        lines.append(f"| {r['arm']} | {r['reward_first_fifth']:.3f} -> "
                     f"{r['reward_last_fifth']:.3f} | {r['held_out_before']:.1%} -> "
                     f"{r['held_out_after']:.1%} ({points:+.1f}) | {r['kl_last_fifth']:.4f} | "
                     f"{r['wall_s']:.0f} | {r['peak_rss_mib']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps of every arm (default: the profile's max_steps)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--per-task", type=int, default=None,
                        help="held-out questions per task (default: the profile's eval_per_task)")
    parser.add_argument("--policy-epochs", type=int, default=None,
                        help="optimizer steps per sampled batch of the grpo and cispo arms "
                             "(default: the profile's policy_epochs)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--arm", default=None, help=argparse.SUPPRESS)  # child: one arm
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)  # child: its output
    args = parser.parse_args()
    if args.arm is not None:
        result = run_arm(args.arm, args.profile, args.steps, args.per_task, args.policy_epochs)
        Path(args.result).write_text(json.dumps(result))
        return
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
    load_before = load()
    results = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for arm in arms:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", arm, "--result",
                   str(out), "--profile", args.profile]
            cmd += ["--steps", str(args.steps)] if args.steps is not None else []
            cmd += ["--per-task", str(args.per_task)] if args.per_task is not None else []
            cmd += (["--policy-epochs", str(args.policy_epochs)]
                    if args.policy_epochs is not None else [])
            subprocess.run(cmd, check=True, cwd=ROOT, env=env)  # one arm per process
            results.append(json.loads(out.read_text()))
        print(arm, json.dumps(results[-1]), flush=True)
    first = results[0]
    print(f"\nprofile {args.profile}, seed {first['seed']}: {first['steps']} steps of "
          f"{first['batch_size']} questions x {first['group_size']} answers, tasks "
          f"{first['tasks']}, lr {first['learning_rate']:g}, {first['questions']} training "
          f"questions, {first['held_out']} held-out; 1 torch thread; load average "
          f"{load_before} before, {load()} after\n")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load(), "arms": results}, f,
                      indent=2)


if __name__ == "__main__":
    main()
