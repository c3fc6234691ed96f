"""Plots of training runs: curves from ``metrics.jsonl`` and a live loss plot (notebook 04).

``plot_metrics`` draws loss (train and, where logged, validation) and learning rate against
the optimizer step; ``extra`` names further metrics to plot (DPO's reward margins, say).
``LiveLossPlot`` is a ``train`` callback that redraws one figure in place in a notebook.

>>> rows = [{"step": s, "loss": 5.0 / s, "lr": 1e-3} for s in range(1, 5)]
>>> rows[-1]["val_loss"] = 1.5
>>> fig = plot_metrics(rows)
>>> [ax.get_ylabel() for ax in fig.axes]
['loss', 'learning rate']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from minimind_lib.core.atomic import read_json_lines
from minimind_lib.core.filenames import METRICS_FILE


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a ``metrics.jsonl`` (one json object per line; a torn last line, left by
    a killed run, is dropped with a warning: ``core.atomic.read_json_lines``)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    return read_json_lines(path)


def _series(rows: Sequence[dict], key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_metrics(metrics: Sequence[dict] | str | Path, *, title: str | None = None,
                 extra: Sequence[str] = (), fig: Figure | None = None, lr: bool = True) -> Figure:
    """Loss (train + validation) and learning rate (unless ``lr=False``) against step, plus one
    panel per ``extra`` metric (``"grad_norm"``, DPO's ``"reward_margin"``...)."""
    rows = read_metrics(metrics) if isinstance(metrics, str | Path) else list(metrics)
    panels = 1 + lr + len(extra)
    if fig is None:
        fig = plt.figure(figsize=(4.2 * panels, 3.2))
    fig.clear()
    axes = fig.subplots(1, panels, squeeze=False)[0]
    steps, loss = _series(rows, "loss")
    axes[0].plot(steps, loss, lw=1, label="train")
    vsteps, vloss = _series(rows, "val_loss")
    if vsteps:
        axes[0].plot(vsteps, vloss, "o-", ms=4, label="validation")
    axes[0].set(xlabel="step", ylabel="loss")
    axes[0].legend()
    if lr:
        axes[1].plot(*_series(rows, "lr"), color="tab:green")
        axes[1].set(xlabel="step", ylabel="learning rate")
    for ax, key in zip(axes[1 + lr:], extra, strict=True):
        ax.plot(*_series(rows, key), color="tab:purple")
        ax.set(xlabel="step", ylabel=key)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


#: Font names that hint at Chinese glyphs (checked against the font file before use).
_CJK_HINTS = ("CJK", "Hei", "Song", "Kai", "Ming", "YaHei", "PingFang", "Hiragino", "WenQuanYi",
              "Source Han", "Noto Sans SC", "Noto Sans TC")
#: What to install when no font has Chinese glyphs (then ``token_labels`` falls back).
CJK_FONT_HINT = ("no installed font has Chinese glyphs: Chinese labels are shown as #k (see the "
                 "printed legend). Install one and restart the kernel: Debian/Ubuntu `sudo apt "
                 "install fonts-noto-cjk`, Fedora `sudo dnf install google-noto-sans-cjk-fonts`, "
                 "conda `conda install -c conda-forge font-ttf-noto-cjk`; macOS and Windows "
                 "have one")


def cjk_font() -> str | None:
    """The name of an installed font with Chinese glyphs, made matplotlib's first sans-serif
    choice (so plots can label Chinese tokens); None when there is none."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    for entry in font_manager.fontManager.ttflist:
        if not any(hint in entry.name for hint in _CJK_HINTS):
            continue
        try:
            has_glyph = FT2Font(entry.fname).get_char_index(ord("中")) != 0
        except (OSError, RuntimeError):
            continue
        if has_glyph:
            plt.rcParams["font.sans-serif"] = [entry.name, *plt.rcParams["font.sans-serif"]]
            return entry.name
    return None


def token_labels(texts: Sequence[str], cjk: bool | None = None) -> tuple[list[str], str]:
    """Plot labels for token ``texts`` and a legend: each text as itself (newlines as ↵, a
    leading or trailing space as ␣, so ``"7"`` and ``" 7"`` are two labels) when it can be
    drawn; without a Chinese font (``cjk`` False, or None and ``cjk_font()`` finds none) a text
    holding a character beyond U+2FFF becomes ``#k``, and the legend (print it beside the plot)
    says what each ``#k`` is.

    >>> token_labels(["The", " cat", "你好", "\\n", "7", " 7"], cjk=False)
    (['The', '␣cat', '#2', '↵', '7', '␣7'], '#2 = 你好')
    """
    if cjk is None:
        cjk = cjk_font() is not None
    labels, legend = [], []
    for k, text in enumerate(texts):
        shown = text.replace("\n", "↵")
        body = shown.strip(" ")
        shown = ("␣" * (len(shown) - len(shown.lstrip(" "))) + body
                 + "␣" * (len(shown) - len(shown.rstrip(" "))) if body else "␣" * len(shown))
        if not cjk and any(ord(c) > 0x2FFF for c in text):
            labels.append(f"#{k}")
            legend.append(f"#{k} = {shown}")
        else:
            labels.append(shown)
    return labels, "  ".join(legend)


class LiveLossPlot:
    """A ``train`` callback redrawing the loss curves every ``every`` steps, in place.

    Cheap: one small figure re-rendered every ``every`` steps (and at every validation);
    outside IPython it only collects the rows. ``extra`` and ``lr`` as in ``plot_metrics``.
    """

    def __init__(self, every: int = 10, title: str | None = None, extra: Sequence[str] = (),
                 lr: bool = True):
        self.every, self.title, self.extra, self.lr = every, title, tuple(extra), lr
        self.rows: list[dict] = []
        self._fig: Figure | None = None
        self._handle = None

    def __call__(self, row: dict) -> None:
        self.rows.append(row)
        if row["step"] % self.every == 0 or "val_loss" in row:
            self.draw()

    def draw(self) -> None:
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        if get_ipython() is None:
            return
        if self._fig is None:
            self._fig = plt.figure(figsize=(8.4, 3.2))
        plot_metrics(self.rows, title=self.title, fig=self._fig, extra=self.extra, lr=self.lr)
        if self._handle is None:
            self._handle = display(self._fig, display_id=True)
            plt.close(self._fig)  # shown through the handle only, not again at cell end
        else:
            self._handle.update(self._fig)
