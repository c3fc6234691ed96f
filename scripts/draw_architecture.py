"""Draw docs/figures/architecture.svg: the library's layers, read from the source.

``python scripts/draw_architecture.py``. The layers and the package arrows come from
``tests/test_layout.py`` (the checks the picture illustrates), the modules of each package from
the files on disk, so the drawing cannot drift from the code; the boxes, colours and fonts are
the course's (``notebooks/figures/draw_figures.py``). The red route is one training stage from
the command line to its checkpoint (docs/architecture.md walks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "notebooks" / "figures")]

from draw_figures import DATA, MASK, NOTE, OP, PARAM, arrow, box, canvas, label  # noqa: E402
from test_layout import LAYERS, MODULES, PACKAGES, package_graph  # noqa: E402

OUT = ROOT / "docs" / "figures" / "architecture.svg"
#: what each layer is, in a few words
ROLES = {
    "core": "file names, atomic writes, checked reads, device + memory, the one download",
    "tokenizer": "byte-level BPE, special tokens, chat template",
    "model": "config, RoPE, attention, MoE, decoder, checkpoints, int8, HF bridge",
    "data": "jsonl readers, pretraining stream, SFT examples, task families",
    "tools": "tool schemas, the safe executor, reading calls, the tool loop",
    "evaluation": "held-out questions, perplexity, preferences, precision table",
    "training": "the one engine (loop) + its plug-ins: SFT, DPO, GRPO, LoRA",
    "vision": "scenes, tiny CLIP, VLM, VQA",
    "inference": "chat session, loading, OpenAI-style server, export",
    "course": "profiles, the stage registry, ensure, plan, report",
    "__main__": "the CLI: python -m minimind_lib <command>",
}
COLORS = {"core": NOTE, "tokenizer": DATA, "model": PARAM, "data": DATA, "tools": MASK,
          "evaluation": OP,
          "training": OP, "vision": PARAM, "inference": DATA, "course": MASK, "__main__": NOTE}


def modules_of(package: str) -> list[str]:
    """The modules of a top-level package, as ``name`` (``serve/app`` for a subpackage)."""
    names = sorted(m for m in MODULES if m.split(".")[0] == package and m not in PACKAGES)
    return [m.split(".", 1)[1].replace(".", "/") for m in names if "." in m]


MONO = 7.2  # points: the module names' font size
CHAR = MONO * 0.602 / 72  # inches per character of DejaVu Sans Mono at that size
#: one stage from the CLI to its checkpoint: the modules it passes through, top to bottom
ROUTE = ["__main__", "course.pipeline", "course.stages", "training.sft", "training.loop",
         "model.checkpoint"]


def wrapped(words: list[str], width: int) -> str:
    """``words`` joined by ", " in lines of at most ``width`` characters."""
    lines, line = [], ""
    for w in words:
        if line and len(line) + len(w) + 2 > width:
            lines.append(line + ",")
            line = w
        else:
            line = f"{line}, {w}" if line else w
    return "\n".join([*lines, line])


def draw() -> None:
    width, row, gap, x0 = 11.4, 0.62, 0.12, 1.85
    height = len(LAYERS) * (row + gap) + 1.2
    fig, ax = canvas(width, height)
    graph = package_graph()
    where: dict[str, tuple[float, float]] = {}  # module -> (x centre, y of its text)
    for k, layer in enumerate(LAYERS):
        y = 0.35 + k * (row + gap)
        box(ax, 0.2, y, 1.45, row, layer + ("/" if layer != "__main__" else ".py"),
            COLORS[layer], size=9.5, mono=True, weight="bold")
        box(ax, 1.75, y, 6.35, row, "", COLORS[layer])
        label(ax, x0, y + row - 0.2, ROLES[layer], size=8.2)
        column = 0
        for name in modules_of(layer):
            module = f"{layer}.{name.replace('/', '.')}"
            on_route = module in ROUTE
            label(ax, x0 + column * CHAR, y + 0.12, name, size=MONO, family="DejaVu Sans Mono",
                  color="#b91c1c" if on_route else "#374151",
                  weight="bold" if on_route else "normal")
            where[module] = (x0 + (column + len(name) / 2) * CHAR, y + 0.12)
            column += len(name) + 2
        if layer == "__main__":
            where[layer] = (x0 + 0.3, y + row - 0.25)
        below = sorted(graph.get(layer, set()), key=LAYERS.index)
        label(ax, 8.25, y + row / 2, "imports " + (wrapped(below, 40) if below else "nothing"),
              size=7.6, va="center", color="#4b5563", linespacing=1.3)
    for a, b in zip(ROUTE, ROUTE[1:], strict=False):  # the route, name to name
        (xa, ya), (xb, yb) = where[a], where[b]
        same_row = abs(ya - yb) < 0.01
        if same_row:  # along the row, under the names
            arrow(ax, (xa, ya - 0.05), (xb, yb - 0.05), color="#b91c1c")
        else:
            arrow(ax, (xa, ya - 0.03), (xb, yb + 0.16), color="#b91c1c")
    label(ax, 0.2, height - 0.42, "minimind_lib: packages in layers; each imports only the "
          "layers below it (tests/test_layout.py)", size=11, weight="bold")
    label(ax, 0.2, height - 0.75, "red: python -m minimind_lib sft -> pipeline.ensure -> "
          "stages.sft_stage -> sft.train_sft -> loop.train -> checkpoint.save_model",
          size=8.3, color="#b91c1c")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    draw()
