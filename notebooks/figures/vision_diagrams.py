"""Draw notebook 13's concept diagrams into notebooks/figures/ (run from anywhere):

    python notebooks/figures/vision_diagrams.py

* 13_patches.png: a synthetic picture cut into patches, the patches as a row of tokens, the
  encoder that reads them;
* 13_clip.png: a batch of pictures against its captions: the similarity matrix whose
  diagonal the contrastive loss pulls up, row-wise and column-wise;
* 13_vlm.png: the VLM's input sequence: the chat prompt with image slots, the frozen encoder
  and the projector filling the slots, the answer-only loss.

The pictures are the course's own (``minimind_lib.scenes``), so the figures match the data.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

from minimind_lib.scenes import caption, make_scene, render  # noqa: E402
from minimind_lib.vision import CLIPConfig  # noqa: E402
from minimind_lib.vlm import VisionSettings  # noqa: E402

HERE = Path(__file__).resolve().parent
PATCH = CLIPConfig().patch_size
GRID = CLIPConfig().grid


def arrow(ax, start, end, **kw) -> None:
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.5,
                                 color=kw.pop("color", "#444"), **kw))


def patches_figure(path: Path) -> None:
    scene = make_scene(0, "train", 3)
    image = render(scene)
    fig = plt.figure(figsize=(11, 4.2))
    left = fig.add_axes([0.01, 0.1, 0.3, 0.78])
    left.imshow(image)
    for k in range(1, GRID):
        left.axhline(k * PATCH - 0.5, color="k", lw=0.8)
        left.axvline(k * PATCH - 0.5, color="k", lw=0.8)
    left.set_xticks([])
    left.set_yticks([])
    left.set_title(f"{image.shape[0]}x{image.shape[1]} picture, {PATCH}x{PATCH} patches\n"
                   f"\u201c{caption(scene)}\u201d", fontsize=9)
    shown = [0, 1, None, *range(2 * GRID, 2 * GRID + 4), *range(3 * GRID, 3 * GRID + 4), None,
             GRID * GRID - 1]
    row = fig.add_axes([0.34, 0.5, 0.64, 0.3])
    row.set_xlim(0, len(shown))
    row.set_ylim(0, 1.3)
    row.axis("off")
    for x, k in enumerate(shown):
        if k is None:
            row.text(x + 0.5, 0.6, "...", ha="center", va="center", fontsize=14)
            continue
        r, c = divmod(k, GRID)
        tile = image[r * PATCH:(r + 1) * PATCH, c * PATCH:(c + 1) * PATCH]
        row.imshow(tile, extent=(x + 0.1, x + 0.9, 0.2, 1.0))
        row.add_patch(Rectangle((x + 0.1, 0.2), 0.8, 0.8, fill=False, lw=0.6))
        row.text(x + 0.5, 0.02, str(k), ha="center", fontsize=7)
    row.set_title(f"{GRID * GRID} tokens in reading order; each one is 3x{PATCH}x{PATCH} = "
                  f"{3 * PATCH * PATCH} numbers -> linear layer + learned position", fontsize=9)
    box = fig.add_axes([0.34, 0.08, 0.64, 0.3])
    box.axis("off")
    box.set_xlim(0, 1)
    box.set_ylim(0, 1)
    box.add_patch(Rectangle((0.0, 0.25), 1.0, 0.5, color="#dde8f7"))
    box.text(0.5, 0.5, "encoder blocks: the course's Block without the causal mask\n"
             "(every patch sees every patch)  ->  mean over patches  ->  image embedding",
             ha="center", va="center", fontsize=9)
    arrow(box, (0.5, 1.15), (0.5, 0.78))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def clip_figure(path: Path) -> None:
    scenes = [make_scene(0, "train", i) for i in (3, 5, 8, 11)]
    n = len(scenes)
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    ax.set_xlim(-1.6, n)
    ax.set_ylim(n, -2.0)
    ax.axis("off")
    for i, s in enumerate(scenes):
        ax.imshow(render(s), extent=(-1.45, -0.65, i + 0.9, i + 0.1))
        words = caption(s).split(" ")
        ax.text(i + 0.5, -0.1, "\n".join([" ".join(words[:2]), " ".join(words[2:4]),
                                          " ".join(words[4:])]), ha="center", va="bottom",
                fontsize=8)
        for j in range(n):
            good = i == j
            ax.add_patch(Rectangle((j + 0.05, i + 0.05), 0.9, 0.9,
                                   color="#4c9a5b" if good else "#e9e9e9"))
            ax.text(j + 0.5, i + 0.5, "match" if good else "", ha="center", va="center",
                    color="white", fontsize=8)
    ax.text(n / 2, -1.6, "captions (text encoder)", ha="center", fontsize=10)
    ax.text(-1.05, n - 0.0 + 0.45, "pictures\n(image encoder)", ha="center", fontsize=9)
    ax.set_title("cell (i, j) = exp(t) \u00b7 cos(image i, caption j); the loss is cross-entropy "
                 "along every row AND every column,\nwith the right answer on the diagonal "
                 "(CLIP's symmetric InfoNCE)", fontsize=9)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def vlm_figure(path: Path) -> None:
    parts = [("<|im_start|>system ... <|im_end|>", "#eeeeee", 3.2),
             ("<|im_start|>user\\n", "#eeeeee", 1.8), ("image slots (id -200)", "#f3c98b", 2.6),
             ("What colour is the shape?<|im_end|>", "#eeeeee", 3.2),
             ("<|im_start|>assistant\\n", "#eeeeee", 2.0), ("red<|im_end|>", "#9fd3a4", 1.4)]
    fig, ax = plt.subplots(figsize=(12, 4.4))
    ax.set_aspect("equal")
    ax.set_xlim(0, 14.5)
    ax.set_ylim(0, 4.6)
    ax.axis("off")
    x, slots = 0.1, None
    for text, colour, width in parts:
        ax.add_patch(Rectangle((x, 0.5), width - 0.1, 0.7, color=colour))
        ax.text(x + width / 2, 0.85, text, ha="center", va="center", fontsize=8)
        if "slots" in text:
            slots = x + width / 2
        x += width
    ax.text(0.1, 0.15, "the prompt's ids: text encoded as text (never parsed for markers); the "
            "slots put in by position, so no typed text can make one", fontsize=8.5)
    ax.text(12.9, 1.45, "loss here only", ha="center", fontsize=8, color="#2e7d32")
    red_circle = next(sc for sc in (make_scene(0, "held_out", i) for i in range(100))
                      if sc.pair == ("red", "circle") and sc.count == 1 and sc.size == "big")
    ax.imshow(render(red_circle), extent=(slots - 0.5, slots + 0.5, 4.35, 3.35))
    tokens = VisionSettings().image_tokens
    for y, label, colour in ((2.85, f"frozen image encoder (the tiny CLIP's ViT): {GRID * GRID} "
                              "patch features", "#dde8f7"),
                             (2.05, f"projector: 2x2 patches merged -> MLP -> {tokens} vectors "
                              "of the LM's width", "#f3c98b")):
        ax.add_patch(Rectangle((slots - 3.6, y - 0.28), 7.2, 0.5, color=colour))
        ax.text(slots, y, label, ha="center", va="center", fontsize=8.5)
    arrow(ax, (slots, 3.3), (slots, 3.1))
    arrow(ax, (slots, 2.57), (slots, 2.33))
    arrow(ax, (slots, 1.77), (slots, 1.25))
    ax.text(slots + 3.7, 2.05, "trained", fontsize=8, va="center", color="#a05a00")
    ax.text(slots + 3.7, 2.85, "frozen", fontsize=8, va="center", color="#2a5599")
    ax.set_title(f"MiniMind-V style: the picture becomes {tokens} extra 'words' the chat model "
                 "reads",
                 fontsize=10)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    for name, draw in (("13_patches.png", patches_figure), ("13_clip.png", clip_figure),
                       ("13_vlm.png", vlm_figure)):
        draw(HERE / name)
        print(f"wrote {HERE / name}")
