"""How much of each attribute a trained CLIP's frozen patch features hold: linear probes.

    python scripts/vision_probe.py runs/cpu/vision/clip

For each attribute (shape, count, side, colour) a logistic regression on the frozen image
encoder's patch states, either their mean over patches or all of them side by side, is trained
on pictures of the *training* pairs and scored on new pictures of those pairs ("seen") and on
the held-out pairs. A probe that is right on seen pairs and wrong on held-out ones has learnt,
like the VLM, to use colour as a hint about shape (docs/benchmarks.md, Vision).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from minimind_lib.vision.clip import load_clip, to_pixels
from minimind_lib.vision.scenes import make_scene, render

ATTRIBUTES = ("shape", "count", "side", "colour")
POOLS = {"mean": lambda f: f.mean(dim=1), "all patches": lambda f: f.flatten(1)}


@torch.no_grad()
def features(clip: torch.nn.Module, split: str, n: int, seed: int) -> tuple[list, torch.Tensor]:
    """The first ``n`` scenes of ``split`` and their patch states (n, N, D)."""
    scenes = [make_scene(seed, split, i) for i in range(n)]
    states = [clip.image_encoder.patch_features(to_pixels(np.stack([render(s) for s in
                                                                     scenes[k:k + 500]])))
              for k in range(0, n, 500)]
    return scenes, torch.cat(states)


def probe(x_train: torch.Tensor, y_train: torch.Tensor,
          steps: int = 300) -> Callable[[torch.Tensor], torch.Tensor]:
    """A standardised logistic regression (Adam, light L2); returns x -> predicted class."""
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-5
    w = torch.zeros(x_train.shape[1], int(y_train.max()) + 1, requires_grad=True)
    b = torch.zeros(w.shape[1], requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=1e-2)
    for _ in range(steps):
        loss = F.cross_entropy((x_train - mu) / sd @ w + b, y_train) + 1e-4 * w.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return lambda x: ((x - mu) / sd @ w + b).argmax(dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clip", help="a CLIP folder (runs/<profile>/vision/clip)")
    parser.add_argument("--train", type=int, default=4000, help="training pictures")
    parser.add_argument("--test", type=int, default=1000, help="pictures per test split")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    torch.manual_seed(0)
    clip = load_clip(args.clip)
    data = {split: features(clip, split, n, args.seed)
            for split, n in (("train", args.train), ("seen", args.test), ("held_out", args.test))}
    print("| attribute | features | train | seen pairs | held-out pairs |\n|---|---|---|---|---|")
    for attribute in ATTRIBUTES:
        values = sorted({getattr(s, attribute) for s in data["train"][0]}, key=str)
        labels = {split: torch.tensor([values.index(getattr(s, attribute)) for s in scenes])
                  for split, (scenes, _) in data.items()}
        for name, pool in POOLS.items():
            predict = probe(pool(data["train"][1]), labels["train"])
            acc = {split: (predict(pool(f)) == labels[split]).float().mean().item()
                   for split, (_, f) in data.items()}
            print(f"| {attribute} | {name} | {acc['train']:.1%} | {acc['seen']:.1%} | "
                  f"{acc['held_out']:.1%} |")


if __name__ == "__main__":
    main()
