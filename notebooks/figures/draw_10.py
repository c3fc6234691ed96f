"""Draw notebook 10's concept diagrams (GRPO) into this folder.

    python notebooks/figures/draw_10.py

* ``10_grpo_step.png``: one GRPO step: a group of G answers per question from the current
  policy, rewards from the checker, group-normalised advantages, the clipped objective with a
  KL penalty to the frozen reference, the update;
* ``10_clipped_objective.png``: PPO's clipped objective ``min(rho A, clip(rho) A)`` as a
  function of the ratio rho, for a positive and a negative advantage, with the range where
  the gradient is zero.

Boxes and arrows from ``diagram.py`` (plain matplotlib).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from diagram import arrow, box, canvas

HERE = Path(__file__).resolve().parent


def draw_grpo_step(path: Path) -> None:
    fig, ax = canvas(10, 4.8, 16.4, 7.8)
    q = box(ax, 1.8, 6.0, "question q\n(a checkable task)", "data", w=2.8, h=1.0)
    policy = box(ax, 5.6, 6.0, "policy π_θ\nsamples G answers\n(temperature 1)", "model",
                 w=3.0, h=1.2)
    arrow(ax, q, policy)
    group = box(ax, 10.0, 6.0, "o_1 … o_G\n“7”, “3”, “7”, “73”, …", "data", w=3.4, h=1.0)
    arrow(ax, policy, group)
    reward = box(ax, 14.3, 6.0, "rewards r_i\n1 if exact-match\n(+ format bonus)", "math",
                 w=3.0, h=1.2)
    arrow(ax, group, reward)
    adv = box(ax, 14.3, 3.4, "advantages\nA_i = (r_i − mean r) / std r\n(Dr. GRPO: no std)",
              "math", w=3.4, h=1.2)
    arrow(ax, reward, adv)
    ref = box(ax, 5.6, 1.2, "reference π_ref\n(frozen start model)", "frozen", w=3.0, h=1.0)
    objective = box(ax, 8.3, 3.4, "per token: min(ρ A, clip(ρ, 1±ε) A) − β KL_k3\n"
                                  "ρ = π_θ / π_old,   KL_k3 = π_ref/π_θ − log(π_ref/π_θ) − 1\n"
                                  "mean over tokens (GRPO) or sum / budget (Dr. GRPO)",
                    "math", w=7.2, h=1.4)
    arrow(ax, adv, objective)
    arrow(ax, ref, objective)
    arrow(ax, objective, policy, text="gradient step(s)", color="#b03a2e", ls="--")
    ax.set_title("One GRPO step (Shao et al. 2024, DeepSeekMath eq. 3)", fontsize=11)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def draw_clipped_objective(path: Path, eps: float = 0.2) -> None:
    rho = np.linspace(0.0, 2.0, 401)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=False)
    for ax, a in zip(axes, (1.0, -1.0), strict=True):
        unclipped = rho * a
        objective = np.minimum(unclipped, np.clip(rho, 1 - eps, 1 + eps) * a)
        flat = objective != unclipped  # the clipped term is the min: no gradient there
        ax.plot(rho, unclipped, color="grey", ls=":", label="ρ A (unclipped)")
        ax.plot(rho, objective, color="tab:blue", lw=2, label="min(ρ A, clip(ρ) A)")
        ax.fill_between(rho, objective.min() - 0.2, objective.max() + 0.2, where=flat,
                        color="tab:red", alpha=0.12, label="gradient 0")
        ax.axvline(1.0, color="black", lw=0.6)
        ax.set(xlabel="ratio ρ = π_θ / π_old", title=f"advantage A = {a:+g}  (ε = {eps})")
        ax.legend(fontsize=7, loc="upper left" if a > 0 else "lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    draw_grpo_step(HERE / "10_grpo_step.png")
    draw_clipped_objective(HERE / "10_clipped_objective.png")
    print("wrote", ", ".join(p.name for p in sorted(HERE.glob("10_*.png"))))
