"""Boxes and arrows for the course's concept diagrams (used by the ``draw_NN.py`` scripts
in this folder): plain matplotlib, so every figure can be redrawn with the course's own
environment."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

COLORS = {"data": "#e8f0fe", "model": "#fde7c8", "frozen": "#e6e6e6", "math": "#e4f5e4",
          "bad": "#fadbd8", "note": "#ffffff"}


class Box:
    """A rounded box centred at (x, y), w wide and h high (axis units)."""

    def __init__(self, ax, x: float, y: float, text: str, kind: str, w: float = 2.2,
                 h: float = 0.8):
        self.x, self.y, self.w, self.h = x, y, w, h
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                    fc=COLORS[kind], ec="#444444", lw=1))
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5)

    def edge(self, toward: Box) -> tuple[float, float]:
        """Where the line from this box's centre to ``toward``'s leaves this box."""
        dx, dy = toward.x - self.x, toward.y - self.y
        t = min((self.w / 2 + 0.08) / abs(dx) if dx else float("inf"),
                (self.h / 2 + 0.08) / abs(dy) if dy else float("inf"))
        return self.x + t * dx, self.y + t * dy


def box(ax, x: float, y: float, text: str, kind: str, w: float = 2.2, h: float = 0.8) -> Box:
    return Box(ax, x, y, text, kind, w, h)


def arrow(ax, a: Box, b: Box, text: str = "", color: str = "#333333", ls: str = "-",
          rad: float = 0.0) -> None:
    """An arrow from box ``a``'s edge to box ``b``'s edge."""
    ax.annotate("", xy=b.edge(a), xytext=a.edge(b),
                arrowprops=dict(arrowstyle="->", color=color, lw=1.2, ls=ls,
                                connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((a.x + b.x) / 2, (a.y + b.y) / 2 + 0.25, text, fontsize=8, ha="center",
                color=color)


def canvas(width: float, height: float, xmax: float, ymax: float):
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, ymax)
    ax.axis("off")
    return fig, ax
