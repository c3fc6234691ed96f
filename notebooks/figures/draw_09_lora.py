"""Draw notebook 09's concept diagrams (run from anywhere; rewrites the SVGs beside this file).

* ``09_lora_layer.svg``: a LoRA layer: the frozen ``W0`` and, beside it, the trainable
  ``A`` (r x k) and ``B`` (d x r) whose product, scaled by alpha / r, is added to the output;
* ``09_lora_merge.svg``: merging: ``W0 + (alpha / r) B A = W``, matrices drawn to scale for
  one 256 x 256 projection of the cpu profile's model at r = 8.

    python notebooks/figures/draw_09_lora.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

HERE = Path(__file__).resolve().parent
FROZEN, TRAINED, TEXT = "#c9ccd1", "#8fd18a", "#222222"
plt.rcParams.update({"svg.hashsalt": "minimind-09", "font.size": 11})


def _box(ax, x, y, w, h, color, label, sub=""):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="#555555", lw=1.2))
    ax.text(x + w / 2, y + h / 2 + (0.12 if sub else 0), label, ha="center", va="center",
            fontsize=13, color=TEXT, weight="bold")
    if sub:
        ax.text(x + w / 2, y + h / 2 - 0.22, sub, ha="center", va="center", fontsize=9,
                color=TEXT)


def _arrow(ax, start, end, text="", offset=(0.0, 0.12)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.2,
                                 color="#444444"))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=9, color="#444444")


def draw_layer(path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.6, 3.6))
    ax.set(xlim=(0, 10), ylim=(0, 4.2))
    ax.axis("off")
    ax.text(0.45, 2.1, "x", fontsize=16, ha="center", va="center", style="italic")
    _box(ax, 2.3, 2.5, 2.6, 1.3, FROZEN, "W₀", "d × k, frozen")
    _box(ax, 2.3, 0.4, 1.0, 1.3, TRAINED, "A", "r × k")
    _box(ax, 4.3, 0.4, 1.0, 1.3, TRAINED, "B", "d × r")
    ax.text(4.8, 0.15, "starts at 0", ha="center", va="center", fontsize=9)
    ax.text(6.1, 1.05, "× α / r", fontsize=12, ha="center", va="center")
    ax.add_patch(plt.Circle((7.6, 2.1), 0.28, facecolor="white", edgecolor="#444444"))
    ax.text(7.6, 2.1, "+", fontsize=16, ha="center", va="center")
    ax.text(9.4, 2.1, "h", fontsize=16, ha="center", va="center", style="italic")
    _arrow(ax, (0.7, 2.25), (2.3, 3.15), "k")
    _arrow(ax, (0.7, 1.95), (2.3, 1.05), "k")
    _arrow(ax, (3.3, 1.05), (4.3, 1.05), "r")
    _arrow(ax, (5.3, 1.05), (5.7, 1.05))
    _arrow(ax, (6.5, 1.05), (7.4, 1.9), "d")
    _arrow(ax, (4.9, 3.15), (7.4, 2.3), "d")
    _arrow(ax, (7.88, 2.1), (9.2, 2.1))
    ax.text(5.0, 4.05, "h = W₀x + (α/r)·B·A·x   (Hu et al. 2021, eq. 3)", ha="center",
            fontsize=12)
    ax.add_patch(Rectangle((7.2, 0.25), 0.3, 0.25, facecolor=FROZEN, edgecolor="#555555"))
    ax.text(7.6, 0.37, "frozen", va="center", fontsize=9)
    ax.add_patch(Rectangle((8.5, 0.25), 0.3, 0.25, facecolor=TRAINED, edgecolor="#555555"))
    ax.text(8.9, 0.37, "trained", va="center", fontsize=9)
    fig.savefig(path, metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)


def draw_merge(path: Path, d: int = 256, k: int = 256, r: int = 8) -> None:
    scale = 3.0 / d  # figure units per matrix row or column
    fig, ax = plt.subplots(figsize=(9.6, 3.6))
    ax.set(xlim=(0, 14.2), ylim=(-0.8, 4.0))
    ax.axis("off")
    y = 0.2
    _box(ax, 0.2, y, k * scale, d * scale, FROZEN, "W₀", f"{d} × {k}")
    ax.text(3.7, y + 1.5, "+  α/r ·", fontsize=14, ha="center", va="center")
    _box(ax, 4.6, y, r * scale * 4, d * scale, TRAINED, "B", "")
    ax.text(4.6 + r * scale * 2, y - 0.3, f"{d} × {r}", ha="center", fontsize=9)
    _box(ax, 5.3, y + d * scale - r * scale * 4, k * scale, r * scale * 4, TRAINED, "A", "")
    ax.text(5.3 + k * scale + 0.1, y + d * scale - r * scale * 2, f"{r} × {k}", va="center",
            fontsize=9)
    ax.text(9.0, y + 1.5, "=", fontsize=16, ha="center", va="center")
    _box(ax, 9.6, y, k * scale, d * scale, "#b9d7ea", "W", f"{d} × {k}, plain")
    n_full, n_lora = d * k, r * (d + k)
    ax.text(7.1, -0.6, f"trainable: r(d + k) = {n_lora:,} instead of d·k = {n_full:,} "
            f"({n_lora / n_full:.1%}); after merging, the model is as fast as before",
            ha="center", fontsize=10)
    ax.text(7.1, 3.8, "merge: fold the update into the weight (B drawn 4× wider, A 4× "
            "taller, to be seen)", ha="center", fontsize=10)
    fig.savefig(path, metadata={"Date": None}, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    draw_layer(HERE / "09_lora_layer.svg")
    draw_merge(HERE / "09_lora_merge.svg")
    print(f"wrote {HERE / '09_lora_layer.svg'} and {HERE / '09_lora_merge.svg'}")
