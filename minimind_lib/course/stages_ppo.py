"""The ``ppo`` stage: PPO with a critic on checkable questions (``training.ppo``), GRPO's
sibling (``grpo`` in ``course.stages``) on the same questions, rewards and budget.

``course.stages`` imports this module last, so the stage registers after the course's own
(``list(STAGES)`` ends with it); like ``grpo`` it is not part of ``all``.
"""

from __future__ import annotations

from minimind_lib.core.atomic import read_json_lines
from minimind_lib.core.filenames import METRICS_FILE
from minimind_lib.course.stage_data import held_out_questions, training_data, training_questions
from minimind_lib.course.stage_eval import profile_eval, rl_summary, start_eval, write_eval
from minimind_lib.course.stage_registry import StageContext, register
from minimind_lib.evaluation.model_eval import eval_report
from minimind_lib.model.checkpoint import load_model, save_model
from minimind_lib.training.ppo import train_ppo
from minimind_lib.training.settings import TrainConfig


@register("ppo", requires=("tokenizer", "sft"), starts_from="sft", sources=training_data("sft"),
          serves=True, in_all=False, settings="ppo", evaluates=True, title="PPO",
          curves=("reward", "kl", "value_loss", "explained_variance"),
          validation="val_accuracy: the share of held-out questions answered right, greedily",
          training="the PPO loss of each step's mini-batches: the clipped policy surrogate of "
                   "the GAE advantages plus vf_coef times the clipped value loss",
          description="PPO with a critic and verifiable rewards: sampled answers to checkable "
                      "questions, rewarded by the exact-match checker, per-token advantages "
                      "from a learned value model (GAE); evaluates before and after")
def ppo_stage(ctx: StageContext) -> dict:
    """``ctx.start_dir()`` (sft, or ``--init DIR``) → PPO-trained policy in ``ctx.out_dir``
    with ``profile.ppo`` (``metrics.jsonl``: reward, kl, value_loss, explained_variance per
    step; ``eval.json``: the held-out scores before and after; the critic is trained beside
    the policy and kept only in the checkpoints). Not part of ``all``, as GRPO is not."""
    profile, settings = ctx.profile, ctx.profile.ppo
    tokenizer = ctx.tokenizer()
    policy = load_model(ctx.start_dir())
    questions, _ = training_questions(profile, settings.tasks, None, "ppo")
    held_out = held_out_questions(profile, settings.tasks)  # greedy, every eval_every steps
    before = start_eval(ctx, policy, tokenizer)
    config = TrainConfig.from_stage(settings, profile.train, out_dir=ctx.out_dir,
                                    precision=ctx.precision, device=ctx.device, seed=profile.seed,
                                    progress=ctx.progress)
    train_ppo(policy, tokenizer, questions, settings, config, resume=ctx.resume,
              held_out=held_out, callbacks=ctx.callbacks)
    rows = read_json_lines(ctx.out_dir / METRICS_FILE)  # every step, also those before a resume
    policy = policy.cpu()
    save_model(policy, ctx.out_dir)
    evals = {"sft": before, "ppo": profile_eval(policy, tokenizer, profile, ctx.progress)}
    write_eval(ctx.out_dir, profile.eval_per_task, evals, tasks=settings.tasks)
    print("held-out questions\n" + eval_report(evals))
    return {**rl_summary(rows, evals), "questions": len(questions)}
