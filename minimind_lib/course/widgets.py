"""ipywidgets for the notebooks: the attention explorer (notebook 02).

Drawing lives in plain matplotlib functions (testable without a kernel); the widgets only
wire sliders to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.image import AxesImage


def plot_attention(ax: Axes, weights: torch.Tensor, tokens: Sequence[str],
                   title: str = "") -> AxesImage:
    """Heatmap of one head's attention ``weights`` (T, T): row = query, column = key, colours
    from 0 to 1 (the image is returned, for ``fig.colorbar``).

    >>> import matplotlib; matplotlib.use("Agg")
    >>> fig, ax = plt.subplots()
    >>> image = plot_attention(ax, torch.tensor([[1.0, 0.0], [0.3, 0.7]]), ["a", "b"], "head 0")
    >>> [t.get_text() for t in ax.get_xticklabels()]
    ['a', 'b']
    >>> plt.close(fig)
    """
    if weights.dim() != 2 or not weights.shape[0] == weights.shape[1] == len(tokens):
        raise ValueError(f"weights must be (T, T) with T = len(tokens) = {len(tokens)}, "
                         f"got shape {tuple(weights.shape)}")
    image = ax.imshow(weights.detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=8)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    return image


def attention_explorer(maps: torch.Tensor, tokens: Sequence[str]):
    """Pick a layer and a head with sliders and see its heatmap.

    ``maps`` (L, H, T, T) for one sentence
    (``minimind_lib.model.decoder.attention_maps(...)[:, 0]``), ``tokens`` the T token strings.
    Returns an ``ipywidgets.VBox``; display it in a notebook.
    """
    import ipywidgets as w

    if maps.dim() != 4:
        raise ValueError(f"maps must be (layers, heads, T, T), got shape {tuple(maps.shape)}")
    layer = w.IntSlider(0, 0, maps.shape[0] - 1, description="layer")
    head = w.IntSlider(0, 0, maps.shape[1] - 1, description="head")

    def draw(layer: int, head: int) -> None:
        size = max(4.0, 0.35 * len(tokens))
        fig, ax = plt.subplots(figsize=(size, size))
        image = plot_attention(ax, maps[layer, head], tokens, f"layer {layer}, head {head}")
        fig.colorbar(image, ax=ax, fraction=0.046, label="attention weight")
        plt.show()

    out = w.interactive_output(draw, {"layer": layer, "head": head})
    return w.VBox([w.HBox([layer, head]), out])
