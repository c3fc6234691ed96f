"""Draw notebook 06's concept diagrams (DPO) into this folder.

    python notebooks/figures/draw_06.py

* ``06_dpo_loss.png``: how one preference pair becomes the DPO loss: policy and frozen
  reference score both answers, the implicit rewards, their margin, ``-log sigmoid``;
* ``06_on_policy_pairs.png``: where on-policy pairs come from: the SFT model's own answers,
  graded by the evaluation's checker, paired right vs wrong (the reference when none is right,
  no pair when all are right), next to the offline pairs of the data files.

Boxes and arrows from ``diagram.py`` (plain matplotlib).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from diagram import arrow, box, canvas

HERE = Path(__file__).resolve().parent


def draw_dpo_loss(path: Path) -> None:
    fig, ax = canvas(10, 4.6, 16.4, 7.6)
    pair = box(ax, 1.8, 3.4, "pair (x, y_w, y_l):\nsame prompt x,\nchosen y_w, rejected y_l",
               "data", w=3.0, h=1.2)
    policy = box(ax, 5.6, 5.4, "policy π_θ\n(trained)", "model", w=2.2)
    ref = box(ax, 5.6, 1.4, "reference π_ref\n(frozen SFT copy)", "frozen", w=2.4)
    arrow(ax, pair, policy)
    arrow(ax, pair, ref)
    lp = box(ax, 9.4, 5.4, "log π_θ(y_w|x), log π_θ(y_l|x)\nsummed over answer tokens",
             "math", w=3.9)
    lr = box(ax, 9.4, 1.4, "log π_ref(y_w|x), log π_ref(y_l|x)\n(precomputed once)", "math",
             w=3.9)
    arrow(ax, policy, lp)
    arrow(ax, ref, lr)
    rewards = box(ax, 11.4, 3.4, "implicit rewards\nr̂ = β log π_θ / π_ref\nfor y_w and y_l",
                  "math", w=2.8, h=1.2)
    arrow(ax, lp, rewards)
    arrow(ax, lr, rewards)
    loss = box(ax, 14.85, 3.4, "loss = −log σ(r̂_w − r̂_l)\n(= ln 2 at the start)", "math",
               w=2.9, h=1.2)
    arrow(ax, rewards, loss)
    arrow(ax, loss, policy, color="#b03a2e", ls="--", rad=0.5)
    ax.text(10.2, 7.05, "gradient: raise log π_θ(y_w|x), lower log π_θ(y_l|x),\nweighted by "
            "σ(r̂_l − r̂_w): most for pairs ranked wrongly", fontsize=8, color="#b03a2e",
            ha="center")
    ax.set_title("DPO on one pair (Rafailov et al. 2023, eq. 7)", fontsize=11)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def draw_on_policy_pairs(path: Path) -> None:
    fig, ax = canvas(10, 4.6, 16.4, 7.2)
    q = box(ax, 1.9, 5.8, "training question x\n+ reference answer", "data", w=3.0, h=1.0)
    model = box(ax, 5.6, 5.8, "SFT model answers:\ngreedy + (k−1) samples", "model", w=3.0,
                h=1.0)
    arrow(ax, q, model)
    grade = box(ax, 9.8, 5.8, "grade each answer:\nexact-match + format\n(the evaluation's "
                              "checker)", "math", w=3.2, h=1.2)
    arrow(ax, model, grade)
    cases = [(3.6, "some right, some wrong", "chosen: a right answer\nrejected: a wrong one\n"
                                             "(the greedy one when it is wrong)", "math"),
             (9.0, "none right", "chosen: the reference\nrejected: a wrong answer", "math"),
             (13.8, "all right", "no pair:\nnothing to prefer", "bad")]
    for x, label, text, kind in cases:
        b = box(ax, x, 2.8, text, kind, w=3.8, h=1.2)
        arrow(ax, grade, b)
        ax.text(x, 3.65, label, fontsize=8, ha="center", style="italic")
    box(ax, 8.8, 0.8, "offline pairs (the data files): chosen = the reference, rejected = an "
                      "unrelated answer:\npairs the SFT model already ranks right, not its "
                      "own mistakes", "note", w=13.6, h=0.9)
    ax.set_title("On-policy DPO pairs: the model's own answers, graded", fontsize=11)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    draw_dpo_loss(HERE / "06_dpo_loss.png")
    draw_on_policy_pairs(HERE / "06_on_policy_pairs.png")
    print("wrote", ", ".join(p.name for p in sorted(HERE.glob("06_*.png"))))
