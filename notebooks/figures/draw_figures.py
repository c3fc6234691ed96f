"""Draw the course's concept diagrams: ``python notebooks/figures/draw_figures.py [NAME ...]``.

``--lang zh`` draws the Chinese edition's into ``notebooks/figures/zh/``: every string a figure
draws is replaced by its translation in ``notebooks/i18n/zh/figures.json`` (English -> Chinese;
a string that stays as it is, a symbol or code, maps to itself). A string with letters and no
entry stops the drawing, naming it, so a changed English label cannot slip through untranslated;
``--lang zh --skeleton`` adds the missing strings with an empty translation.

Each ``fig_*`` function below draws one diagram with matplotlib and is saved as
``notebooks/figures/<name>.svg`` (text kept as text, so any browser renders it, Chinese
included, and GitHub and JupyterLab both show it from a notebook's markdown:
``![...](figures/<name>.svg)``). The diagrams are drawn, not measured: every number in them
is an example or a shape, never a result (notebook 13's show the course's own synthetic
pictures, drawn by ``minimind_lib.vision.scenes``). ``tests/test_figures.py`` checks that every figure a
notebook shows exists and that this script draws exactly the files in this folder.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

HERE = Path(__file__).resolve().parent
# the SVGs keep text as text, rendered by the reader's browser: a glyph matplotlib's own font
# lacks (Chinese) is only missing from the layout estimate, not from the picture
warnings.filterwarnings("ignore", message="Glyph .* missing from font")
plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "minimind", "font.size": 10,
                     "font.family": "DejaVu Sans"})

# one colour per kind of thing, in every diagram
DATA, OP, PARAM, MASK, NOTE = "#dbeafe", "#fde68a", "#d9f99d", "#fecaca", "#f3f4f6"
FIGURES: dict[str, Callable[[], plt.Figure]] = {}


def figure(fn: Callable[[], plt.Figure]) -> Callable[[], plt.Figure]:
    """Register ``fig_<name>`` as the drawing of ``<name>.svg``."""
    FIGURES[fn.__name__.removeprefix("fig_")] = fn
    return fn


def canvas(width: float, height: float) -> tuple[plt.Figure, plt.Axes]:
    """A blank figure whose data coordinates are inches (so boxes keep their shape)."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, width), ylim=(0, height))
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", color: str = DATA,
        size: float = 10, mono: bool = False, edge: str = "#374151",
        **kw) -> tuple[float, float, float, float]:
    """A rounded box with its lower-left corner at (x, y), text centred; returns (x, y, w, h)
    for ``link``."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.06",
                                fc=color, ec=edge, lw=1))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size,
                family="DejaVu Sans Mono" if mono else "DejaVu Sans", **kw)
    return x, y, w, h


def arrow(ax, start: tuple[float, float], end: tuple[float, float], text: str = "",
          color: str = "#374151", style: str = "-|>", side: str = "right", size: float = 8.5,
          rad: float = 0.0) -> None:
    """An arrow from ``start`` to ``end``, optionally labelled beside its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color,
                                 lw=1.2, connectionstyle=f"arc3,rad={rad}"))
    if text:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        dx = 0.08 if side == "right" else -0.08
        ax.text(mx + dx, my, text, ha="left" if side == "right" else "right", va="center",
                fontsize=size, color="#374151")


def link(ax, a: tuple[float, float, float, float], b: tuple[float, float, float, float],
         text: str = "", color: str = "#374151", ls: str = "-", rad: float = 0.0,
         size: float = 8.5) -> None:
    """An arrow from box ``a`` to box ``b`` (each the (x, y, w, h) ``box`` returns), on the line
    between their centres, from edge to edge; ``text`` beside its middle."""

    def centre(r):
        return r[0] + r[2] / 2, r[1] + r[3] / 2

    def edge(r, toward):
        (x, y), (tx, ty) = centre(r), centre(toward)
        dx, dy = tx - x, ty - y
        t = min((r[2] / 2 + 0.06) / abs(dx) if dx else float("inf"),
                (r[3] / 2 + 0.06) / abs(dy) if dy else float("inf"))
        return x + t * dx, y + t * dy

    start, end = edge(a, b), edge(b, a)
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color,
                                 lw=1.2, ls=ls, connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.12, (start[1] + end[1]) / 2, text, ha="left",
                va="center", fontsize=size, color=color)


def label(ax, x: float, y: float, text: str, size: float = 9, **kw) -> None:
    ax.text(x, y, text, fontsize=size, **kw)


def grid(ax, x: float, y: float, cells: list[list[str]], colors: list[list[str]],
         cell: float = 0.32, size: float = 8) -> None:
    """A matrix of small squares, row 0 at the top; ``cells`` its texts."""
    for r, row in enumerate(cells):
        for c, text in enumerate(row):
            ax.add_patch(Rectangle((x + c * cell, y - (r + 1) * cell), cell, cell,
                                   fc=colors[r][c], ec="#6b7280", lw=0.6))
            if text:
                ax.text(x + (c + 0.5) * cell, y - (r + 0.5) * cell, text, ha="center",
                        va="center", fontsize=size)


# =========================================================================== 00 · setup


@figure
def fig_course_map() -> plt.Figure:
    fig, ax = canvas(10.5, 3.3)
    stages = [("data/\n*.jsonl", "00", NOTE), ("tokenizer", "01", OP), ("model\n(architecture)",
              "02 · 03", PARAM), ("pretrain", "04", OP), ("SFT", "05", OP), ("DPO", "06", OP),
              ("int8", "07", OP), ("chat &\nserve", "08", DATA)]
    for k, (name, nb, color) in enumerate(stages):
        x = 0.2 + k * 1.3
        box(ax, x, 1.6, 1.05, 0.8, name, color)
        label(ax, x + 0.52, 2.55, f"notebook {nb}", size=8, ha="center")
        if k:
            arrow(ax, (x - 0.25, 2.0), (x - 0.02, 2.0))
    label(ax, 0.2, 1.05, "runs/<profile>/<stage>/ : model.safetensors + config.json + "
          "metrics.jsonl, made by pipeline.ensure(stage, profile) or python -m minimind_lib "
          "<stage>", size=8.5)
    label(ax, 0.2, 0.65, "data/reference/sft/ : the cpu-profile chat model after SFT, shipped "
          "so notebooks 02, 03, 07 and 08 can show a model that works before you train one",
          size=8.5)
    label(ax, 0.2, 0.25, "beyond the main line: 09 LoRA · 10 GRPO · 11 mixture of experts · "
          "12 long context · 13 vision", size=8.5, color="#4b5563")
    label(ax, 0.2, 3.0, "The course: one stage per notebook, each stage's output feeds the next",
          size=11, weight="bold")
    return fig


@figure
def fig_data_formats() -> plt.Figure:
    fig, ax = canvas(10.5, 3.4)
    rows = [("pretrain_sample.jsonl", '{"text": "床前明月光，疑是地上霜。..."}',
             "pretraining: next-token prediction on every token (notebook 04)"),
            ("sft_sample.jsonl", '{"conversations": [{"role": "user", "content": "..."},\n'
             '                   {"role": "assistant", "content": "..."}]}',
             "SFT: loss on the assistant's replies only (notebook 05)"),
            ("dpo_sample.jsonl", '{"chosen":   [user, assistant (better)],\n'
             ' "rejected": [user, assistant (worse)]}',
             "DPO: make chosen more likely than rejected (notebook 06)")]
    for k, (name, line, use) in enumerate(rows):
        y = 2.45 - k * 1.05
        box(ax, 0.2, y, 1.95, 0.75, name, NOTE, size=8.5, mono=True)
        box(ax, 2.35, y, 4.55, 0.75, line, DATA, size=7.8, mono=True)
        arrow(ax, (7.0, y + 0.37), (7.3, y + 0.37))
        label(ax, 7.35, y + 0.37, use.replace(": ", ":\n", 1).replace(" (", "\n("), size=8.3,
              va="center")
    label(ax, 0.2, 3.25, "One JSON object per line (JSON Lines), MiniMind's own formats",
          size=11, weight="bold")
    return fig


# =========================================================================== 01 · tokenizer


@figure
def fig_bpe_pipeline() -> plt.Figure:
    fig, ax = canvas(10.5, 2.9)
    steps = [("text", '"low 你好"', NOTE),
             ("UTF-8 bytes", "6C 6F 77 20\nE4 BD A0\nE5 A5 BD", DATA),
             ("byte-level\nsymbols", "l o w Ġ\nä ½ ł\nå ¥ ½", DATA),
             ("pre-tokens\n(GPT-2 regex)", "[low]\n[Ġä½łå¥½]", DATA),
             ("apply merges\nin rank order", "low | Ġ |\nä½ł | å¥½", OP),
             ("ids", "[5139, 223,\n 2507, 1002]", PARAM)]
    for k, (title, body, color) in enumerate(steps):
        x = 0.15 + k * 1.72
        label(ax, x + 0.72, 2.3, title, size=9, ha="center", va="center", weight="bold")
        box(ax, x, 0.95, 1.45, 0.9, body, color, size=9, mono=True)
        if k:
            arrow(ax, (x - 0.26, 1.4), (x - 0.03, 1.4))
    label(ax, 0.15, 0.45, "decode = the reverse: ids -> each token's bytes -> join -> UTF-8 "
          "(decode the whole sequence: a token may hold part of a character). The ids are the "
          "course tokenizer's.", size=8.5)
    return fig


@figure
def fig_bpe_merge_step() -> plt.Figure:
    fig, ax = canvas(10.5, 3.2)
    label(ax, 0.2, 2.95, "One BPE step on Sennrich's toy corpus (word counts x5, x2, x6, x3)",
          size=11, weight="bold")
    words = [("l o w", 5), ("l o w e r", 2), ("n e w e s t", 6), ("w i d e s t", 3)]
    for k, (w, n) in enumerate(words):
        box(ax, 0.2, 2.2 - k * 0.55, 1.9, 0.42, f"{w}   ×{n}", DATA, size=9, mono=True)
    arrow(ax, (2.3, 1.5), (3.3, 1.5))
    label(ax, 2.35, 1.65, "count pairs", size=8)
    counts = [("e s", 9), ("s t", 9), ("w e", 8), ("l o", 7), ("o w", 7), ("n e", 6), ("...", "")]
    for k, (p, n) in enumerate(counts):
        box(ax, 3.5, 2.3 - k * 0.33, 1.5, 0.27, f"({p}) {n}", MASK if k == 0 else NOTE, size=8.5,
            mono=True)
    label(ax, 5.1, 2.4, "most frequent;\nties -> smallest\n(left id, right id)", size=8)
    arrow(ax, (6.2, 1.5), (7.7, 1.5))
    label(ax, 6.25, 1.65, "merge (e, s) -> es", size=8)
    for k, (w, n) in enumerate([("l o w", 5), ("l o w e r", 2), ("n e w es t", 6),
                                ("w i d es t", 3)]):
        box(ax, 7.9, 2.2 - k * 0.55, 1.9, 0.42, f"{w}   ×{n}", DATA, size=9, mono=True)
    label(ax, 0.2, 0.15, "repeat until the vocabulary is full: every merge adds one token "
          "(its id = 3 specials + 256 bytes + merges so far)", size=8.5)
    return fig


@figure
def fig_chatml() -> plt.Figure:
    fig, ax = canvas(10.9, 2.6)
    pieces = [("<|im_start|>", MASK), ("system\nYou are a helpful assistant", DATA),
              ("<|im_end|>", MASK), ("\\n", NOTE), ("<|im_start|>", MASK), ("user\n1 + 1 = ?", DATA),
              ("<|im_end|>", MASK), ("\\n", NOTE), ("<|im_start|>", MASK), ("assistant\n", DATA)]
    widths = [1.05, 2.2, 0.95, 0.3, 1.05, 1.3, 0.95, 0.3, 1.05, 0.9]
    x = 0.1
    for (text, color), w in zip(pieces, widths, strict=True):
        box(ax, x, 1.1, w - 0.05, 0.7, text, color, size=8, mono=True)
        x += w
    label(ax, 0.1, 2.2, "ChatML: the prompt of a one-question chat (add_generation_prompt=True)",
          size=11, weight="bold")
    label(ax, 0.1, 0.65, "red: special tokens, one id each (<|im_start|> = 1, <|im_end|> = 2), "
          "made only by the template, never by parsing message content", size=8.5)
    label(ax, 0.1, 0.3, "blue: ordinary text, encoded with allowed_special=set(); the model "
          "continues after 'assistant\\n' and stops at its own <|im_end|>", size=8.5)
    return fig


# =========================================================================== 02 · attention


@figure
def fig_attention_shapes() -> plt.Figure:
    fig, ax = canvas(10.5, 3.6)
    box(ax, 0.1, 1.45, 1.3, 0.7, "x\n(B, T, C)", DATA)
    for k, (name, shape) in enumerate([("Q = x W_Q", "(B, H, T, D)"), ("K = x W_K",
                                       "(B, H_kv, T, D)"), ("V = x W_V", "(B, H_kv, T, D)")]):
        y = 2.55 - k * 1.0
        box(ax, 1.9, y, 1.55, 0.7, f"{name}\n{shape}", PARAM, size=9)
        arrow(ax, (1.42, 1.8), (1.88, y + 0.35))
    box(ax, 4.0, 2.05, 1.7, 0.7, "Q Kᵀ / √D\n(B, H, T, T)", OP, size=9)
    arrow(ax, (3.47, 2.9), (3.98, 2.5))
    arrow(ax, (3.47, 1.9), (3.98, 2.3))
    box(ax, 6.0, 2.05, 1.35, 0.7, "+ mask\n(-inf above\nthe diagonal)", MASK, size=8.5)
    arrow(ax, (5.72, 2.4), (5.98, 2.4))
    box(ax, 7.65, 2.05, 1.2, 0.7, "softmax\nper row", OP, size=9)
    arrow(ax, (7.37, 2.4), (7.63, 2.4))
    box(ax, 7.65, 0.75, 1.2, 0.7, "weights @ V\n(B, H, T, D)", OP, size=9)
    arrow(ax, (8.25, 2.03), (8.25, 1.47))
    arrow(ax, (3.47, 0.9), (7.63, 1.05))
    box(ax, 9.1, 0.75, 1.3, 0.7, "merge heads,\nW_O: (B, T, C)", PARAM, size=8.5)
    arrow(ax, (8.87, 1.1), (9.08, 1.1))
    label(ax, 0.1, 3.35, "One attention layer, with the shape of every tensor "
          "(B batch, T tokens, C width, H heads of size D = C / H)", size=11, weight="bold")
    label(ax, 0.1, 0.25, "GQA: K and V have H_kv < H heads; query head h reads KV head "
          "h // (H / H_kv)", size=8.5)
    return fig


@figure
def fig_causal_mask_and_cache() -> plt.Figure:
    fig, ax = canvas(10.5, 3.5)
    t = 5
    cells = [["" for _ in range(t)] for _ in range(t)]
    colors = [[DATA if j <= i else MASK for j in range(t)] for i in range(t)]
    grid(ax, 0.6, 2.9, cells, colors, cell=0.42)
    for i in range(t):
        label(ax, 0.35, 2.9 - (i + 0.5) * 0.42, f"q{i}", size=8, va="center")
        label(ax, 0.6 + (i + 0.5) * 0.42, 2.98, f"k{i}", size=8, ha="center")
    label(ax, 0.2, 3.3, "Training: all T queries at once", size=10, weight="bold")
    label(ax, 0.2, 0.45, "blue: may attend (j <= i)\nred: -inf, weight exactly 0", size=8.5)
    label(ax, 4.0, 3.3, "Generation with a KV cache: one new query per step", size=10,
          weight="bold")
    for step in range(3):
        y = 2.55 - step * 0.8
        n = 3 + step
        for j in range(n):
            cached = j < n - 1
            ax.add_patch(Rectangle((4.6 + j * 0.45, y), 0.42, 0.42, fc=NOTE if cached else PARAM,
                                   ec="#6b7280", lw=0.6))
            ax.text(4.6 + (j + 0.5) * 0.45, y + 0.21, f"k{j}", ha="center", va="center",
                    fontsize=7.5)
        box(ax, 4.6 + n * 0.45 + 0.2, y, 0.6, 0.42, f"q{n - 1}", OP, size=8)
        label(ax, 4.0, y + 0.21, f"step {step + 1}", size=8, va="center")
    label(ax, 4.0, 0.45, "grey: keys/values cached from earlier steps (never change: causal)\n"
          "green: the new token's k, v, appended; the one query sees every key, so no mask\n"
          "(SDPA's is_causal=True would align top-left and let it see k0 only)", size=8.5)
    return fig


@figure
def fig_gqa_heads() -> plt.Figure:
    fig, ax = canvas(10.5, 2.6)
    label(ax, 0.2, 2.35, "Grouped-query attention: 8 query heads share 2 key/value heads "
          "(MiniMind2-Small)", size=11, weight="bold")
    for h in range(8):
        box(ax, 0.6 + h * 1.2, 1.45, 0.9, 0.45, f"Q head {h}", OP, size=8)
    for g in range(2):
        x = 0.6 + g * 4.8 + 1.55
        box(ax, x, 0.35, 1.5, 0.5, f"K, V head {g}", PARAM, size=8.5)
        for h in range(4 * g, 4 * g + 4):
            arrow(ax, (x + 0.75, 0.87), (0.6 + h * 1.2 + 0.45, 1.43), style="-")
    label(ax, 0.2, 0.05, "the KV cache holds 2 heads instead of 8: 4x smaller; "
          "H_kv = H is multi-head attention, H_kv = 1 multi-query", size=8.5)
    return fig


# =========================================================================== 03 · transformer


@figure
def fig_blocks() -> plt.Figure:
    fig, ax = canvas(10.5, 4.6)

    def column(x: float, title: str, rows: list[tuple[str, str]], note: str) -> None:
        label(ax, x, 4.35, title, size=10.5, weight="bold")
        y = 3.75
        for text, color in rows:
            box(ax, x + 0.3, y - 0.45, 2.6, 0.45, text, color, size=8.5)
            y -= 0.62
        for k in range(len(rows) - 1):
            arrow(ax, (x + 1.6, 3.3 - k * 0.62), (x + 1.6, 3.14 - k * 0.62))
        label(ax, x, 0.2, note, size=8.3)

    column(0.1, "Classic (2017, post-norm)",
           [("x + positions (sinusoids)", NOTE), ("multi-head attention (causal)", OP),
            ("x = LayerNorm(x + attn)", MASK), ("MLP 4C, GELU", OP),
            ("x = LayerNorm(x + mlp)", MASK)],
           "the norm sits on the residual path:\n2L renormalisations; needs warm-up")
    column(3.6, "MiniMind / Llama (pre-norm)",
           [("x (no position vectors)", NOTE), ("h = RMSNorm(x)", MASK),
            ("x = x + GQA-attention(h), RoPE on q, k", OP), ("h = RMSNorm(x)", MASK),
            ("x = x + SwiGLU(h), width ≈ 8C/3", OP)],
           "an untouched identity path from output\nto embedding; one final norm at the end")
    label(ax, 7.1, 4.35, "What changed, and why", size=10.5, weight="bold")
    reasons = ["post-norm -> pre-norm: trains without\nfragile warm-up (Xiong et al. 2020)",
               "LayerNorm -> RMSNorm: no centring,\nno bias, cheaper (Zhang & Sennrich 2019)",
               "sinusoids -> RoPE: scores depend on\nrelative position (Su et al. 2021)",
               "GELU MLP -> SwiGLU: gated, better at\nthe same size (Shazeer 2020)",
               "multi-head -> GQA: 4x smaller KV cache\n(Ainslie et al. 2023)"]
    for k, r in enumerate(reasons):
        label(ax, 7.1, 3.6 - k * 0.68, r, size=8.3, va="center")
    return fig


@figure
def fig_model_overview() -> plt.Figure:
    fig, ax = canvas(10.5, 3.3)
    label(ax, 0.15, 3.05, "MiniMind2-Small: token ids in, next-token logits out", size=11,
          weight="bold")
    parts = [("token ids\n(B, T)", NOTE), ("embed_tokens\nV x C", PARAM), ("h\n(B, T, C)", DATA),
             ("L x Block\n(RoPE cos/sin\nfor positions\nstart..end)", OP), ("RMSNorm\n(final)", MASK),
             ("lm_head\nC -> V", PARAM), ("logits\n(B, T, V)", DATA)]
    for k, (text, color) in enumerate(parts):
        x = 0.15 + k * 1.48
        box(ax, x, 1.0, 1.22, 1.15, text, color, size=8.5)
        if k:
            arrow(ax, (x - 0.25, 1.57), (x - 0.02, 1.57))
    arrow(ax, (2.24, 2.17), (8.16, 2.17), style="<|-|>", rad=-0.15)
    label(ax, 5.2, 2.72, "the same V x C matrix (tied weights, Press & Wolf 2017)", size=8.5,
          ha="center")
    label(ax, 0.15, 0.45, "generate: logits of the last position -> pick a token (greedy argmax, "
          "or sample at temperature T) -> append -> repeat; with a KV cache only the new token "
          "goes through", size=8.5)
    label(ax, 0.15, 0.12, "the loss: cross-entropy of logits[:, t] against token t + 1 "
          "(the labels are shifted, not the logits)", size=8.5)
    return fig


@figure
def fig_rope_rotation() -> plt.Figure:
    import math

    fig, ax = canvas(10.5, 3.4)
    label(ax, 0.2, 3.15, "RoPE: pair (x_i, x_{i+D/2}) of a query or key at position m turns by "
          "m·θ_i", size=11, weight="bold")
    for k, (m, name) in enumerate([(0, "position 0"), (1, "position 1"), (2, "position 2"),
                                   (5, "position 5")]):
        cx, cy, r = 1.1 + k * 2.1, 1.55, 0.75
        ax.add_patch(matplotlib.patches.Circle((cx, cy), r, fill=False, ec="#9ca3af"))
        for theta, color in [(0.9, "#dc2626"), (0.25, "#2563eb")]:
            a = m * theta
            ax.annotate("", (cx + r * math.cos(a), cy + r * math.sin(a)), (cx, cy),
                        arrowprops=dict(arrowstyle="-|>", color=color, lw=1.3))
        label(ax, cx, 0.55, name, size=9, ha="center")
    label(ax, 8.7, 2.3, "red: a fast pair\n(large θ_i)", size=8.5, color="#dc2626")
    label(ax, 8.7, 1.6, "blue: a slow pair\n(θ_i = base^(-2i/D))", size=8.5, color="#2563eb")
    label(ax, 0.2, 0.12, "q at m and k at n: ⟨R_m q, R_n k⟩ = ⟨q, R_(n-m) k⟩, the score depends "
          "only on m - n", size=8.5)
    return fig


# =========================================================================== 04 · pretraining


@figure
def fig_training_step() -> plt.Figure:
    fig, ax = canvas(10.5, 4.2)
    label(ax, 0.15, 3.95, "One optimizer step (minimind_lib.training.loop.train_step, built in notebook "
          "04)", size=11, weight="bold")
    box(ax, 0.15, 2.75, 1.7, 0.75, "lr = warmup,\nthen cosine(step)", NOTE, size=8.5)
    arrow(ax, (1.87, 3.12), (2.15, 3.12))
    ax.add_patch(FancyBboxPatch((2.2, 1.6), 4.4, 2.1, boxstyle="round,pad=0.02",
                                fc="none", ec="#9ca3af", ls="--"))
    label(ax, 2.3, 3.45, "repeat A times (accumulation)", size=8.5, color="#4b5563")
    box(ax, 2.35, 2.55, 1.3, 0.7, "micro-batch\n(B/A, T+1)", DATA, size=8.5)
    box(ax, 3.9, 2.55, 1.2, 0.7, "forward\nunder autocast", OP, size=8.5)
    box(ax, 5.3, 2.55, 1.2, 0.7, "loss / A\n(fp32)", DATA, size=8.5)
    arrow(ax, (3.67, 2.9), (3.88, 2.9))
    arrow(ax, (5.12, 2.9), (5.28, 2.9))
    box(ax, 3.9, 1.7, 2.6, 0.6, "scaler.scale(loss / A).backward()\n.grad adds up", OP, size=8.5)
    arrow(ax, (5.9, 2.53), (5.9, 2.32))
    steps = [("unscale_\n(fp16 only)", OP), ("clip global\nnorm to c", OP),
             ("finite loss\nand norm?", MASK), ("scaler.step:\nAdamW", PARAM),
             ("scaler.update;\nzero_grad", NOTE)]
    for k, (text, color) in enumerate(steps):
        x = 0.15 + k * 2.05
        box(ax, x, 0.45, 1.6, 0.75, text, color, size=8.5)
        if k:
            arrow(ax, (x - 0.43, 0.82), (x - 0.02, 0.82))
    label(ax, 6.1, 0.95, "yes", size=8)
    arrow(ax, (3.9, 1.7), (1.0, 1.22))
    label(ax, 4.35, 0.15, "no: skip the step (logged); max_bad_steps in a row stop training",
          size=8.3, color="#b91c1c")
    return fig


@figure
def fig_token_stream() -> plt.Figure:
    fig, ax = canvas(10.5, 3.0)
    label(ax, 0.15, 2.75, "Pretraining data: one uint16 stream of token ids, read through a "
          "memory map", size=11, weight="bold")
    tokens = ["床", "前", "明", "月", "光", "<eot>", "The", " king", " is", "<eot>", "春", "眠",
              "不"]
    for k, t in enumerate(tokens):
        box(ax, 0.15 + k * 0.78, 1.75, 0.73, 0.5, t, MASK if t == "<eot>" else DATA, size=8.5)
    for k, (start, color) in enumerate([(0, "#2563eb"), (4, "#16a34a"), (8, "#9333ea")]):
        x0, x1 = 0.15 + start * 0.78, 0.15 + (start + 5) * 0.78 - 0.05
        ax.plot([x0, x1], [1.6 - k * 0.12] * 2, color=color, lw=3)
    label(ax, 0.15, 1.05, "windows of T + 1 = 5 tokens; consecutive windows share one token, "
          "so each token is a target exactly once", size=8.5)
    label(ax, 0.15, 0.6, "inputs = window[:-1] = 床 前 明 月      targets = window[1:] = 前 明 月 光"
          "      (the model shifts the labels itself)", size=8.5)
    label(ax, 0.15, 0.2, "<eot> = <|endoftext|> ends each document; 1 document in 50 goes to "
          "the validation stream", size=8.5)
    return fig


@figure
def fig_float_formats() -> plt.Figure:
    fig, ax = canvas(10.5, 2.7)
    label(ax, 0.15, 2.45, "Floating-point formats: sign | exponent (range) | mantissa "
          "(precision)", size=11, weight="bold")
    formats = [("fp32", 1, 8, 23, "range 1e±38, ~7 digits"),
               ("bf16", 1, 8, 7, "fp32's range, ~3 digits: no loss scaling needed"),
               ("fp16", 1, 5, 10, "max 65504, nothing below 6e-8: small gradients vanish")]
    w = 0.2
    for k, (name, s, e, m, note) in enumerate(formats):
        y = 1.75 - k * 0.6
        label(ax, 0.15, y + 0.12, name, size=10, weight="bold")
        x = 0.85
        for n, color in [(s, MASK), (e, OP), (m, DATA)]:
            ax.add_patch(Rectangle((x, y), n * w, 0.35, fc=color, ec="#6b7280", lw=0.6))
            x += n * w
        label(ax, x + 0.15, y + 0.12, note, size=8.3)
    return fig


# =========================================================================== 05 · SFT


@figure
def fig_sft_mask() -> plt.Figure:
    fig, ax = canvas(10.5, 2.8)
    label(ax, 0.15, 2.55, "SFT: the loss only where the assistant speaks", size=11,
          weight="bold")
    pieces = [("<|im_start|>", False), ("system\\n", False), ("You are…", False),
              ("<|im_end|>", False), ("\\n", False), ("<|im_start|>", False), ("user\\n", False),
              ("3+5=?", False), ("<|im_end|>", False), ("\\n", False), ("<|im_start|>", False),
              ("assistant\\n", False), ("8", True), ("<|im_end|>", True), ("\\n", False)]
    x = 0.1
    for text, supervised in pieces:
        w = 0.16 + 0.064 * len(text)
        box(ax, x, 1.5, w, 0.5, text, "#b7e4b0" if supervised else NOTE, size=7, mono=True)
        label(ax, x + w / 2, 1.25, "label" if supervised else "-100", size=7, ha="center",
              color="#166534" if supervised else "#6b7280")
        x += w + 0.04
    label(ax, 0.15, 0.7, "green: targets (the reply's tokens and the <|im_end|> that closes it: "
          "the model learns to answer and to stop)", size=8.5)
    label(ax, 0.15, 0.3, "grey: context only (label -100 = F.cross_entropy's ignore_index): "
          "the question conditions every prediction but is never one", size=8.5)
    return fig


@figure
def fig_sft_batch() -> plt.Figure:
    fig, ax = canvas(10.5, 2.9)
    label(ax, 0.15, 2.65, "An SFT batch: right-padded to its longest example", size=11,
          weight="bold")
    rows = [(9, 3), (6, 2), (11, 4)]
    longest = max(n for n, _ in rows)
    for r, (n, answer) in enumerate(rows):
        y = 1.9 - r * 0.5
        for j in range(longest):
            if j >= n:
                color, text = "#e5e7eb", "pad"
            elif j >= n - answer:
                color, text = "#b7e4b0", "t"
            else:
                color, text = NOTE, "c"
            ax.add_patch(Rectangle((0.9 + j * 0.5, y), 0.48, 0.4, fc=color, ec="#6b7280",
                                   lw=0.6))
            ax.text(0.9 + (j + 0.5) * 0.5, y + 0.2, text, ha="center", va="center", fontsize=7.5)
        label(ax, 0.15, y + 0.2, f"row {r}", size=8.5, va="center")
    label(ax, 6.7, 1.9, "c: context (label -100)\nt: target (label = id)\npad: <|endoftext|> "
          "id,\nlabel -100", size=8.5, va="top")
    label(ax, 0.15, 0.15, "no attention mask needed: causal attention means a real token never "
          "sees the pads to its right", size=8.5)
    return fig


# =========================================================================== 06 · DPO


@figure
def fig_dpo_loss() -> plt.Figure:
    """Notebook 06: one preference pair, scored by the policy and the frozen reference, becomes
    the DPO loss."""
    fig, ax = canvas(10.8, 4.7)
    label(ax, 0.15, 4.45, "DPO on one pair (Rafailov et al. 2023, eq. 7)", size=11, weight="bold")
    pair = box(ax, 0.15, 1.45, 1.9, 0.85, "pair (x, y_w, y_l):\nsame prompt x,\nchosen y_w, "
               "rejected y_l", DATA, size=8.5)
    policy = box(ax, 2.6, 2.75, 1.5, 0.6, "policy π_θ\n(trained)", PARAM, size=8.5)
    ref = box(ax, 2.5, 0.4, 1.7, 0.6, "reference π_ref\n(frozen SFT copy)", NOTE, size=8.5)
    link(ax, pair, policy)
    link(ax, pair, ref)
    lp = box(ax, 4.6, 2.75, 2.6, 0.6, "log π_θ(y_w|x), log π_θ(y_l|x)\nsummed over answer tokens",
             OP, size=8.5)
    lr = box(ax, 4.55, 0.4, 2.7, 0.6, "log π_ref(y_w|x), log π_ref(y_l|x)\n(precomputed once)",
             OP, size=8.5)
    link(ax, policy, lp)
    link(ax, ref, lr)
    rewards = box(ax, 6.85, 1.45, 1.7, 0.85, "implicit rewards\nr̂ = β log π_θ / π_ref\n"
                  "for y_w and y_l", OP, size=8.5)
    link(ax, lp, rewards)
    link(ax, lr, rewards)
    loss = box(ax, 9.0, 1.45, 1.65, 0.85, "loss =\n−log σ(r̂_w − r̂_l)\n(= ln 2 at the start)",
               OP, size=8.5)
    link(ax, rewards, loss)
    ax.add_patch(FancyArrowPatch((loss[0] + loss[2] / 2, 2.36), (3.35, 3.41), arrowstyle="-|>",
                                 mutation_scale=12, color="#b91c1c", lw=1.2, ls="--",
                                 connectionstyle="arc3,rad=0.2"))
    label(ax, 6.7, 3.72, "gradient: raise log π_θ(y_w|x), lower log π_θ(y_l|x),\nweighted by "
          "σ(r̂_l − r̂_w): most for pairs ranked wrongly", size=8, color="#b91c1c", ha="center",
          va="bottom")
    return fig


@figure
def fig_on_policy_pairs() -> plt.Figure:
    """Notebook 06: on-policy pairs from the SFT model's own graded answers, next to the offline
    pairs of the data files."""
    fig, ax = canvas(10.5, 4.5)
    label(ax, 0.15, 4.25, "On-policy DPO pairs: the model's own answers, graded", size=11,
          weight="bold")
    q = box(ax, 0.15, 3.0, 1.9, 0.65, "training question x\n+ reference answer", DATA, size=8.5)
    model = box(ax, 2.55, 3.0, 2.1, 0.65, "SFT model answers:\ngreedy + (k−1) samples", PARAM,
                size=8.5)
    link(ax, q, model)
    grade = box(ax, 5.15, 2.92, 2.2, 0.8, "grade each answer:\nexact-match + format\n"
                "(the evaluation's checker)", OP, size=8.5)
    link(ax, model, grade)
    cases = [(0.5, "some right, some wrong", "chosen: a right answer\nrejected: a wrong one\n"
              "(the greedy one when it is wrong)", PARAM),
             (3.95, "none right", "chosen: the reference\nrejected: a wrong answer", PARAM),
             (7.4, "all right", "no pair:\nnothing to prefer", MASK)]
    for x, case, text, color in cases:
        b = box(ax, x, 1.15, 2.6, 0.95, color=color)
        link(ax, grade, b)
        label(ax, x + 1.3, 1.9, case, size=8.5, ha="center", va="center", style="italic")
        label(ax, x + 1.3, 1.48, text, size=8.5, ha="center", va="center")
    box(ax, 0.5, 0.2, 9.5, 0.6, "offline pairs (the data files): chosen = the reference, "
        "rejected = an unrelated answer:\npairs the SFT model already ranks right, not its own "
        "mistakes", "white", size=8.5)
    return fig


# =========================================================================== 07 · quantisation


@figure
def fig_absmax() -> plt.Figure:
    fig, ax = canvas(10.5, 2.8)
    label(ax, 0.15, 2.55, "absmax int8: the largest |w| of a row maps to 127, the rest "
          "proportionally", size=11, weight="bold")
    ax.plot([0.8, 9.8], [1.7, 1.7], color="#374151", lw=1)
    for q in range(-127, 128, 16):
        x = 5.3 + q / 127 * 4.5
        ax.plot([x, x], [1.62, 1.78], color="#6b7280", lw=0.8)
    for x, t in [(0.8, "-max|w|  (q = -127)"), (5.3, "0"), (9.8, "max|w|  (q = 127)")]:
        label(ax, x, 1.92, t, size=8.5, ha="center")
    for w in (-0.61, 0.23, 0.87):
        x = 5.3 + w * 4.5
        ax.plot([x], [1.7], "o", color="#dc2626", ms=5)
        q = round(w * 127)
        label(ax, x, 1.3, f"w = {w:+.2f}·max -> q = {q}", size=8, ha="center", color="#b91c1c")
    label(ax, 0.15, 0.75, "s = max|w| / 127,  q = round(w / s) ∈ [-127, 127],  ŵ = s·q,  "
          "|w - ŵ| <= s / 2", size=9)
    label(ax, 0.15, 0.3, "per tensor: one s for the matrix; per channel: one s_i per output row "
          "(4 bytes per row: 1.6% of a 256-wide row)", size=8.5)
    return fig


@figure
def fig_int8_linear() -> plt.Figure:
    fig, ax = canvas(10.5, 2.8)
    label(ax, 0.15, 2.55, "Weight-only int8 Linear: y = (x Qᵀ) ⊙ s", size=11, weight="bold")
    box(ax, 0.15, 1.2, 1.4, 0.8, "x\n(..., in)\nfloat", DATA, size=8.5)
    box(ax, 0.15, 0.2, 1.4, 0.8, "Q (out, in)\nint8: 1 byte", PARAM, size=8.5)
    box(ax, 2.0, 0.2, 1.6, 0.8, "cast to x's\ndtype", OP, size=8.5)
    arrow(ax, (1.57, 0.6), (1.98, 0.6))
    box(ax, 4.1, 0.9, 1.6, 0.8, "x @ Qᵀ\n(..., out)", OP, size=8.5)
    arrow(ax, (1.57, 1.6), (4.08, 1.4))
    arrow(ax, (3.62, 0.6), (4.08, 1.1))
    box(ax, 6.2, 0.9, 1.6, 0.8, "⊙ s\n(out,) fp32", OP, size=8.5)
    arrow(ax, (5.72, 1.3), (6.18, 1.3))
    box(ax, 8.3, 0.9, 1.6, 0.8, "y\n(..., out)", DATA, size=8.5)
    arrow(ax, (7.82, 1.3), (8.28, 1.3))
    label(ax, 4.1, 2.05, "s scales whole rows of W = whole output columns, so it can wait "
          "until after the matmul", size=8.5)
    return fig


# =========================================================================== 08 · inference


@figure
def fig_sampling_pipeline() -> plt.Figure:
    fig, ax = canvas(10.5, 2.6)
    label(ax, 0.15, 2.35, "From logits to the next token (minimind_lib.model.sampling.sample_next_token)",
          size=11, weight="bold")
    steps = [("logits z\n(V,)", DATA), ("repetition\npenalty\n(optional)", NOTE),
             ("z / T\n(T = 0: argmax)", OP), ("top-k: keep\nthe k best", MASK),
             ("top-p: keep the\nsmallest set\nwith mass >= p", MASK), ("softmax ->\nsample", OP),
             ("next\ntoken", PARAM)]
    for k, (text, color) in enumerate(steps):
        x = 0.15 + k * 1.48
        box(ax, x, 0.75, 1.2, 1.05, text, color, size=8.5)
        if k:
            arrow(ax, (x - 0.26, 1.27), (x - 0.02, 1.27))
    label(ax, 0.15, 0.25, "removed tokens get -inf, so softmax gives them probability exactly 0;"
          " the best token always survives top-p", size=8.5)
    return fig


@figure
def fig_serving() -> plt.Figure:
    fig, ax = canvas(10.5, 3.2)
    label(ax, 0.15, 2.95, "Serving: one HTTP server, one model, one generation at a time",
          size=11, weight="bold")
    for k, name in enumerate(["browser\n(chat page at /)", "openai client", "httpx / curl"]):
        box(ax, 0.15, 2.0 - k * 0.75, 1.6, 0.6, name, NOTE, size=8.5)
        arrow(ax, (1.77, 2.3 - k * 0.75), (2.48, 1.6), style="<|-|>")
    box(ax, 2.5, 0.9, 2.3, 1.45, "uvicorn event loop\nFastAPI routes:\nPOST /generate\n"
        "POST /v1/chat/completions\nGET /v1/models", OP, size=8.3)
    box(ax, 5.3, 1.3, 1.4, 0.6, "job queue", DATA, size=8.5)
    arrow(ax, (4.82, 1.6), (5.28, 1.6))
    label(ax, 4.85, 1.72, "submit", size=8)
    box(ax, 7.2, 0.9, 1.5, 1.45, "worker thread:\nmodel.stream\n(KV cache)", PARAM, size=8.5)
    arrow(ax, (6.72, 1.6), (7.18, 1.6))
    arrow(ax, (7.18, 1.0), (4.82, 1.0))
    label(ax, 5.0, 0.6, "tokens -> text, streamed back\n(server-sent events)", size=8)
    label(ax, 8.85, 1.6, "a model must not\ninterleave two\ngenerations", size=8, va="center")
    label(ax, 0.15, 0.1, "bad requests get HTTP 400 with OpenAI's error shape; it binds "
          "127.0.0.1 unless told otherwise", size=8.5)
    return fig


# =========================================================================== 11 · MoE


@figure
def fig_moe_layer() -> plt.Figure:
    fig, ax = canvas(10.5, 3.9)
    label(ax, 0.15, 3.65, "A mixture-of-experts FFN (MiniMind: E = 4 routed, top-k = 2, "
          "1 shared)", size=11, weight="bold")
    box(ax, 0.15, 1.5, 1.2, 0.7, "token x\n(C,)", DATA, size=9)
    box(ax, 1.8, 2.3, 1.6, 0.7, "router W_g\nsoftmax, top-k", OP, size=8.5)
    arrow(ax, (1.37, 1.95), (1.78, 2.55))
    for e in range(4):
        chosen = e in (1, 3)
        box(ax, 4.0 + e * 1.2, 2.3, 1.0, 0.6, f"expert {e}", PARAM if chosen else "#f9fafb",
            size=8.5, edge="#374151" if chosen else "#d1d5db")
    for e, w in [(1, "w = 0.62"), (3, "w = 0.38")]:
        arrow(ax, (3.42, 2.75), (4.0 + e * 1.2 + 0.5, 2.92), rad=-0.25)
        label(ax, 4.0 + e * 1.2 + 0.6, 3.0, w, size=8)
    box(ax, 4.0, 1.0, 2.2, 0.6, "shared expert (every token)", PARAM, size=8.5)
    arrow(ax, (1.37, 1.7), (3.98, 1.3))
    box(ax, 8.9, 1.5, 1.4, 0.7, "y = Σ w_e·FFN_e(x)\n+ shared(x)", OP, size=8)
    arrow(ax, (6.22, 1.3), (8.88, 1.75))
    arrow(ax, (5.7, 2.28), (8.88, 1.95))
    arrow(ax, (8.1, 2.28), (8.95, 2.1))
    label(ax, 0.15, 0.35, "parameters grow with E; compute per token with k + shared. The "
          "load-balancing loss keeps the router from sending everything to one expert.",
          size=8.5)
    return fig


@figure
def fig_moe_dispatch() -> plt.Figure:
    fig, ax = canvas(10.5, 3.1)
    label(ax, 0.15, 2.85, "Sorted dispatch: each expert runs once, on the tokens routed to it",
          size=11, weight="bold")
    slots = [(0, 1), (0, 3), (1, 0), (1, 1), (2, 1), (2, 2)]
    for k, (tok, e) in enumerate(slots):
        box(ax, 0.15 + k * 0.75, 1.8, 0.65, 0.55, f"t{tok}→e{e}", DATA, size=8)
    label(ax, 0.15, 1.55, "slots (token, choice): N·k of them", size=8.5)
    arrow(ax, (4.8, 2.07), (6.3, 2.07))
    label(ax, 4.85, 2.2, "argsort by expert", size=8)
    groups = {0: [1], 1: [0, 1, 2], 2: [2], 3: [0]}
    x = 6.5
    for e, toks in groups.items():
        box(ax, x, 2.35 - e * 0.45, 0.8, 0.37, f"e{e}", PARAM, size=8)
        label(ax, x + 0.95, 2.53 - e * 0.45, "tokens " + ", ".join(f"t{t}" for t in toks), size=8,
              va="center")
    label(ax, 0.15, 0.55, "then y.index_add_(0, tokens, w · expert(x[tokens])): the same sum as "
          "running every expert on every token and weighing the unchosen by 0", size=8.5)
    label(ax, 0.15, 0.2, "an expert treats each token independently, so how tokens are grouped "
          "changes only the order of float additions", size=8.5)
    return fig


# =========================================================================== 12 · long context


@figure
def fig_rope_turns() -> plt.Figure:
    fig, ax = canvas(10.5, 3.0)
    label(ax, 0.15, 2.75, "Past the training length T, slow RoPE pairs reach angles never "
          "seen", size=11, weight="bold")
    ax.add_patch(Rectangle((0.8, 0.7), 4.0, 1.6, fc=DATA, ec="none"))
    ax.add_patch(Rectangle((4.8, 0.7), 5.2, 1.6, fc=MASK, ec="none", alpha=0.6))
    label(ax, 2.8, 2.4, "positions 0 .. T (training)", size=8.5, ha="center")
    label(ax, 7.4, 2.4, "T .. 8T (reading long)", size=8.5, ha="center")
    import numpy as np

    xs = np.linspace(0.8, 10.0, 400)
    for k, (turns, color) in enumerate([(6.0, "#2563eb"), (0.6, "#dc2626")]):
        y0 = 1.85 - k * 0.75
        ax.plot(xs, y0 + 0.25 * np.sin(2 * np.pi * turns * (xs - 0.8) / 4.0), color=color, lw=1.2)
    label(ax, 0.15, 1.85, "fast", size=8.5, color="#2563eb", va="center")
    label(ax, 0.15, 1.1, "slow", size=8.5, color="#dc2626", va="center")
    label(ax, 0.15, 0.15, "fast pairs turned many times within T: every angle was seen; a slow "
          "pair only saw part of its circle.\nPI, NTK and YaRN slow the pairs down (each "
          "differently) so that long inputs stay within the angles seen in training.", size=8.3)
    return fig


@figure
def fig_alibi() -> plt.Figure:
    fig, ax = canvas(10.5, 3.0)
    label(ax, 0.15, 2.75, "ALiBi: no rotation, a distance penalty per head added to the scores",
          size=11, weight="bold")
    t = 5
    for h, (slope, x0) in enumerate([(0.5, 0.6), (0.0625, 4.0)]):
        cells = [[("" if j > i else "0" if i == j else f"{-slope * (i - j):g}") for j in range(t)]
                 for i in range(t)]
        colors = [[MASK if j > i else ("#bfdbfe" if i == j else DATA) for j in range(t)]
                  for i in range(t)]
        grid(ax, x0, 2.4, cells, colors, cell=0.4, size=7)
        label(ax, x0, 0.25, f"head {'0' if h == 0 else 'H-1'}: slope m = {slope:g}", size=8.5)
    label(ax, 7.3, 1.8, "score(i, j) = q_i·k_j / √d\n            - m_h·(i - j)\n\n"
          "steep heads look close by,\ngentle heads far; red = -inf\n(the causal mask)",
          size=8.5, va="center")
    return fig


LORA_FROZEN, LORA_TRAINED, LORA_TEXT = "#c9ccd1", "#8fd18a", "#222222"


def _lora_box(ax, x, y, w, h, color, label, sub=""):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="#555555", lw=1.2))
    ax.text(x + w / 2, y + h / 2 + (0.12 if sub else 0), label, ha="center", va="center",
            fontsize=13, color=LORA_TEXT, weight="bold")
    if sub:
        ax.text(x + w / 2, y + h / 2 - 0.22, sub, ha="center", va="center", fontsize=9,
                color=LORA_TEXT)


def _lora_arrow(ax, start, end, text="", offset=(0.0, 0.12)):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.2,
                                 color="#444444"))
    if text:
        ax.text((start[0] + end[0]) / 2 + offset[0], (start[1] + end[1]) / 2 + offset[1], text,
                ha="center", va="bottom", fontsize=9, color="#444444")


@figure
def fig_lora_layer() -> plt.Figure:
    """Notebook 09: a LoRA layer, the frozen W0 beside the trained A and B (Hu et al. 2021)."""
    fig, ax = plt.subplots(figsize=(8.6, 3.6))
    ax.set(xlim=(0, 10), ylim=(0, 4.2))
    ax.axis("off")
    ax.text(0.45, 2.1, "x", fontsize=16, ha="center", va="center", style="italic")
    _lora_box(ax, 2.3, 2.5, 2.6, 1.3, LORA_FROZEN, "W₀", "d × k, frozen")
    _lora_box(ax, 2.3, 0.4, 1.0, 1.3, LORA_TRAINED, "A", "r × k")
    _lora_box(ax, 4.3, 0.4, 1.0, 1.3, LORA_TRAINED, "B", "d × r")
    ax.text(4.8, 0.15, "starts at 0", ha="center", va="center", fontsize=9)
    ax.text(6.1, 1.05, "× α / r", fontsize=12, ha="center", va="center")
    ax.add_patch(plt.Circle((7.6, 2.1), 0.28, facecolor="white", edgecolor="#444444"))
    ax.text(7.6, 2.1, "+", fontsize=16, ha="center", va="center")
    ax.text(9.4, 2.1, "h", fontsize=16, ha="center", va="center", style="italic")
    _lora_arrow(ax, (0.7, 2.25), (2.3, 3.15), "k")
    _lora_arrow(ax, (0.7, 1.95), (2.3, 1.05), "k")
    _lora_arrow(ax, (3.3, 1.05), (4.3, 1.05), "r")
    _lora_arrow(ax, (5.3, 1.05), (5.7, 1.05))
    _lora_arrow(ax, (6.5, 1.05), (7.4, 1.9), "d")
    _lora_arrow(ax, (4.9, 3.15), (7.4, 2.3), "d")
    _lora_arrow(ax, (7.88, 2.1), (9.2, 2.1))
    ax.text(5.0, 4.05, "h = W₀x + (α/r)·B·A·x   (Hu et al. 2021, eq. 3)", ha="center",
            fontsize=12)
    ax.add_patch(Rectangle((7.2, 0.25), 0.3, 0.25, facecolor=LORA_FROZEN, edgecolor="#555555"))
    ax.text(7.6, 0.37, "frozen", va="center", fontsize=9)
    ax.add_patch(Rectangle((8.5, 0.25), 0.3, 0.25, facecolor=LORA_TRAINED, edgecolor="#555555"))
    ax.text(8.9, 0.37, "trained", va="center", fontsize=9)
    return fig


@figure
def fig_lora_merge() -> plt.Figure:
    """Notebook 09: merging folds (alpha/r) B A into W0; one 256 x 256 projection, r = 8."""
    d, k, r = 256, 256, 8
    scale = 3.0 / d  # figure units per matrix row or column
    fig, ax = plt.subplots(figsize=(9.6, 3.6))
    ax.set(xlim=(0, 14.2), ylim=(-0.8, 4.0))
    ax.axis("off")
    y = 0.2
    _lora_box(ax, 0.2, y, k * scale, d * scale, LORA_FROZEN, "W₀", f"{d} × {k}")
    ax.text(3.7, y + 1.5, "+  α/r ·", fontsize=14, ha="center", va="center")
    _lora_box(ax, 4.6, y, r * scale * 4, d * scale, LORA_TRAINED, "B", "")
    ax.text(4.6 + r * scale * 2, y - 0.3, f"{d} × {r}", ha="center", fontsize=9)
    _lora_box(ax, 5.3, y + d * scale - r * scale * 4, k * scale, r * scale * 4, LORA_TRAINED, "A", "")
    ax.text(5.3 + k * scale + 0.1, y + d * scale - r * scale * 2, f"{r} × {k}", va="center",
            fontsize=9)
    ax.text(9.0, y + 1.5, "=", fontsize=16, ha="center", va="center")
    _lora_box(ax, 9.6, y, k * scale, d * scale, "#b9d7ea", "W", f"{d} × {k}, plain")
    n_full, n_lora = d * k, r * (d + k)
    ax.text(7.1, -0.6, f"trainable: r(d + k) = {n_lora:,} instead of d·k = {n_full:,} "
            f"({n_lora / n_full:.1%}); after merging, the model is as fast as before",
            ha="center", fontsize=10)
    ax.text(7.1, 3.8, "merge: fold the update into the weight (B drawn 4× wider, A 4× "
            "taller, to be seen)", ha="center", fontsize=10)
    return fig


# =========================================================================== 10 · GRPO


@figure
def fig_grpo_step() -> plt.Figure:
    """Notebook 10: one GRPO step, from a group of sampled answers to the update."""
    fig, ax = canvas(10.5, 4.6)
    label(ax, 0.15, 4.35, "One GRPO step (Shao et al. 2024, DeepSeekMath eq. 3)", size=11,
          weight="bold")
    q = box(ax, 0.15, 3.2, 1.7, 0.6, "question q\n(a checkable task)", DATA, size=8.5)
    policy = box(ax, 2.4, 3.1, 1.9, 0.8, "policy π_θ\nsamples G answers\n(temperature 1)", PARAM,
                 size=8.5)
    link(ax, q, policy)
    group = box(ax, 4.9, 3.2, 2.2, 0.6, "o_1 … o_G\n“7”, “3”, “7”, “73”, …", DATA, size=8.5)
    link(ax, policy, group)
    reward = box(ax, 7.7, 3.1, 2.0, 0.8, "rewards r_i\n1 if exact-match\n(+ format bonus)", OP,
                 size=8.5)
    link(ax, group, reward)
    adv = box(ax, 7.5, 1.6, 2.4, 0.8, "advantages\nA_i = (r_i − mean r) / std r\n"
              "(Dr. GRPO: no std)", OP, size=8.5)
    link(ax, reward, adv)
    ref = box(ax, 2.4, 0.2, 1.9, 0.6, "reference π_ref\n(frozen start model)", NOTE, size=8.5)
    objective = box(ax, 2.2, 1.5, 4.6, 1.0, "per token: min(ρ A, clip(ρ, 1±ε) A) − β KL_k3\n"
                    "ρ = π_θ / π_old,   KL_k3 = π_ref/π_θ − log(π_ref/π_θ) − 1\n"
                    "mean over tokens (GRPO) or sum / budget (Dr. GRPO)", OP, size=8.5)
    link(ax, adv, objective)
    link(ax, ref, objective)
    link(ax, objective, policy, "gradient step(s)", color="#b91c1c", ls="--")
    return fig


@figure
def fig_clipped_objective() -> plt.Figure:
    """Notebook 10: PPO's clipped objective against the ratio, for A = +1 and A = -1, with the
    range where its gradient is 0."""
    import numpy as np

    eps = 0.2
    rho = np.linspace(0.0, 2.0, 401)
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.3))
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
        ax.legend(fontsize=7.5, loc="upper left" if a > 0 else "lower left")
    fig.tight_layout()
    return fig



# =========================================================================== 13 · vision


@figure
def fig_patches() -> plt.Figure:
    """Notebook 13: one of the course's own pictures (``minimind_lib.vision.scenes``) as patch tokens."""
    from minimind_lib.vision.scenes import caption, make_scene, render
    from minimind_lib.vision.clip import CLIPConfig

    patch, n = CLIPConfig().patch_size, CLIPConfig().grid
    scene = make_scene(0, "train", 3)
    image = render(scene)
    fig, ax = canvas(10.5, 3.9)
    fig.suppressComposite = True  # each picture its own pixels in the SVG, drawn crisp
    side = 3.0
    ax.imshow(image, extent=(0.2, 0.2 + side, 0.2, 0.2 + side), aspect="auto",
              interpolation="none")
    for k in range(1, n):
        ax.plot([0.2 + k * side / n] * 2, [0.2, 0.2 + side], color="black", lw=0.8)
        ax.plot([0.2, 0.2 + side], [0.2 + k * side / n] * 2, color="black", lw=0.8)
    ax.add_patch(Rectangle((0.2, 0.2), side, side, fill=False, ec="black", lw=0.8))
    label(ax, 0.2 + side / 2, 3.3, f"{image.shape[0]}x{image.shape[1]} picture, {patch}x{patch} "
          f"patches\n\u201c{caption(scene)}\u201d", size=9, ha="center", va="bottom")
    shown = [0, 1, None, *range(2 * n, 2 * n + 4), *range(3 * n, 3 * n + 4), None, n * n - 1]
    step, tile = 0.475, 0.4
    for i, k in enumerate(shown):
        x = 3.75 + i * step
        if k is None:
            label(ax, x + tile / 2, 2.45, "...", size=14, ha="center", va="center")
            continue
        r, c = divmod(k, n)
        ax.imshow(image[r * patch:(r + 1) * patch, c * patch:(c + 1) * patch],
                  extent=(x, x + tile, 2.25, 2.25 + tile), aspect="auto", interpolation="none")
        ax.add_patch(Rectangle((x, 2.25), tile, tile, fill=False, ec="black", lw=0.6))
        label(ax, x + tile / 2, 2.12, str(k), size=7, ha="center", va="top")
    label(ax, 3.75 + len(shown) * step / 2, 2.9, f"{n * n} tokens in reading order; each one is "
          f"3x{patch}x{patch} = {3 * patch * patch} numbers -> linear layer + learned position",
          size=9, ha="center", va="bottom")
    arrow(ax, (3.75 + len(shown) * step / 2, 1.8), (3.75 + len(shown) * step / 2, 1.42))
    box(ax, 3.75, 0.55, len(shown) * step - 0.05, 0.8, "encoder blocks: the course's Block "
        "without the causal mask\n(every patch sees every patch)  ->  mean over patches  ->  "
        "image embedding", DATA, size=9)
    return fig


@figure
def fig_clip() -> plt.Figure:
    """Notebook 13: a batch of pictures against its captions, the similarity matrix of CLIP."""
    from minimind_lib.vision.scenes import caption, make_scene, render

    scenes = [make_scene(0, "train", i) for i in (3, 5, 8, 11)]
    n, cell, x0, top = len(scenes), 1.0, 1.9, 4.75
    fig, ax = canvas(6.9, 6.3)
    fig.suppressComposite = True
    label(ax, 0.15, 6.05, "cell (i, j) = exp(t) · cos(image i, caption j); the loss is "
          "cross-entropy along every row AND\nevery column, with the right answer on the "
          "diagonal (CLIP's symmetric InfoNCE)", size=9, va="top")
    label(ax, x0 + n * cell / 2, 5.45, "captions (text encoder)", size=10, ha="center")
    for i, s in enumerate(scenes):
        y = top - (i + 1) * cell
        ax.imshow(render(s), extent=(0.75, 1.55, y + 0.1, y + 0.9), aspect="auto",
                  interpolation="none")
        words = caption(s).split(" ")
        label(ax, x0 + (i + 0.5) * cell, top + 0.08, "\n".join(
            [" ".join(words[:2]), " ".join(words[2:4]), " ".join(words[4:])]), size=8,
            ha="center", va="bottom")
        for j in range(n):
            ax.add_patch(Rectangle((x0 + j * cell + 0.05, y + 0.05), cell - 0.1, cell - 0.1,
                                   color="#4c9a5b" if i == j else "#e9e9e9"))
            if i == j:
                label(ax, x0 + (j + 0.5) * cell, y + 0.5, "match", size=8, ha="center",
                      va="center", color="white")
    label(ax, 1.15, top - n * cell - 0.1, "pictures\n(image encoder)", size=9, ha="center",
          va="top")
    return fig


@figure
def fig_vlm() -> plt.Figure:
    """Notebook 13: the VLM's input: the chat prompt with image slots, filled by the frozen
    encoder and the trained projector; the loss on the answer only."""
    from minimind_lib.vision.scenes import make_scene, render
    from minimind_lib.vision.clip import CLIPConfig
    from minimind_lib.vision.recipe import VisionSettings

    n, tokens = CLIPConfig().grid, VisionSettings().image_tokens
    fig, ax = canvas(10.5, 4.3)
    label(ax, 0.15, 4.05, f"MiniMind-V style: the picture becomes {tokens} extra 'words' the "
          "chat model reads", size=11, weight="bold")
    parts = [("<|im_start|>system ... <|im_end|>", NOTE), ("<|im_start|>user\\n", NOTE),
             ("image slots (id -200)", OP), ("What colour is the shape?<|im_end|>", NOTE),
             ("<|im_start|>assistant\\n", NOTE), ("red<|im_end|>", "#b7e4b0")]
    x = 0.15
    for text, color in parts:
        w = 0.058 * len(text) + 0.25
        b = box(ax, x, 0.55, w, 0.6, text, color, size=7.5)
        if "slots" in text:
            slots = x + w / 2
        x += w + 0.05
    label(ax, b[0] + b[2] / 2, 1.25, "loss here only", size=8, ha="center", color="#166534")
    label(ax, 0.15, 0.15, "the prompt's ids: text encoded as text (never parsed for markers); "
          "the slots put in by position, so no typed text can make one", size=8.5)
    red_circle = next(sc for sc in (make_scene(0, "held_out", i) for i in range(100))
                      if sc.pair == ("red", "circle") and sc.count == 1 and sc.size == "big")
    ax.imshow(render(red_circle), extent=(slots - 0.35, slots + 0.35, 3.05, 3.75), aspect="auto",
              interpolation="none")
    box(ax, slots - 2.3, 2.3, 4.6, 0.45, f"frozen image encoder (the tiny CLIP's ViT): {n * n} "
        "patch states, 1 embedding", DATA, size=8)
    box(ax, slots - 2.45, 1.55, 4.9, 0.45, f"projector: 2x2 blocks -> MLP, embedding -> MLP: "
        f"{tokens} vectors of the LM's width", OP, size=8)
    label(ax, slots + 2.45, 2.52, "frozen", size=8, va="center", color="#2a5599")
    label(ax, slots + 2.6, 1.77, "trained", size=8, va="center", color="#a05a00")
    arrow(ax, (slots, 3.03), (slots, 2.79))
    arrow(ax, (slots, 2.28), (slots, 2.04))
    arrow(ax, (slots, 1.53), (slots, 1.19))
    return fig


# ---------------------------------------------------------------------------------------------


#: the Chinese edition's labels: English string -> Chinese
LABELS = {"zh": HERE.parent / "i18n" / "zh" / "figures.json"}
WORDS = re.compile(r"[A-Za-z]{2,}")  # a string with a word in it needs a translation


@contextmanager
def speaking(table: dict[str, str] | None, seen: set[str]) -> Iterator[None]:
    """Every text a figure draws passes through ``Text.set_text``: record each string in
    ``seen`` and, given a ``table``, draw its translation instead."""
    original = Text.set_text

    def set_text(self, s):
        text = "" if s is None else str(s)
        if text.strip():
            seen.add(text)
        original(self, table.get(text) or text if table is not None else s)

    Text.set_text = set_text
    try:
        yield
    finally:
        Text.set_text = original


def read_labels(lang: str) -> dict[str, str]:
    path = LABELS[lang]
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def untranslated(seen: set[str], table: dict[str, str]) -> list[str]:
    """The strings with a word in them that have no (non-empty) translation."""
    return sorted(s for s in seen if WORDS.search(s) and not table.get(s, "").strip())


def draw(names: list[str], out_dir: Path | None = None, lang: str = "en") -> list[Path]:
    """Draw the named figures (all when empty) into ``out_dir`` (default: this folder, or its
    ``<lang>/`` subfolder); return the files written. In another language every label must
    have its translation (``SystemExit`` names the ones that do not)."""
    unknown = sorted(set(names) - set(FIGURES))
    if unknown:
        raise SystemExit(f"unknown figure(s): {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    table = None if lang == "en" else read_labels(lang)
    out_dir = out_dir or (HERE if lang == "en" else HERE / lang)
    out_dir.mkdir(exist_ok=True)
    written, seen = [], set()
    with speaking(table, seen):
        for name in names or list(FIGURES):
            fig = FIGURES[name]()
            path = out_dir / f"{name}.svg"
            fig.savefig(path, metadata={"Date": None, "Creator": None})
            plt.close(fig)
            written.append(path)
    missing = untranslated(seen, table) if table is not None else []
    if missing:
        raise SystemExit(f"{len(missing)} label(s) have no {lang} translation in "
                         f"{LABELS[lang]}: {missing[:5]}... (python "
                         f"notebooks/figures/draw_figures.py --lang {lang} --skeleton adds them)")
    return written


def skeleton(lang: str) -> int:
    """Add every untranslated label to the language's table, with an empty translation."""
    seen: set[str] = set()
    with speaking({}, seen):
        for fn in FIGURES.values():
            plt.close(fn())
    table = read_labels(lang)
    missing = untranslated(seen, table)
    table.update({s: "" for s in missing})
    LABELS[lang].write_text(json.dumps(dict(sorted(table.items())), indent=1,
                                       ensure_ascii=False) + "\n", encoding="utf-8")
    return len(missing)


if __name__ == "__main__":
    args = sys.argv[1:]
    lang = "en"
    if "--lang" in args:
        k = args.index("--lang")
        lang, args = args[k + 1], args[:k] + args[k + 2:]
    if "--skeleton" in args:
        print(f"{skeleton(lang)} label(s) added to {LABELS[lang]}")
        sys.exit(0)
    for p in draw(args, lang=lang):
        print(p.relative_to(HERE.parent.parent))
