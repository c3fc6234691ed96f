"""Is the VLM held back by its CLIP's features or by its training steps? Train it on ideal ones.

    python scripts/vision_oracle.py runs/smoke/vision/clip --steps 250 500

For each number of steps, the smoke profile's VLM (the shipped reference chat model, a new
projector, answer-only training) is trained twice: once on the frozen CLIP's patch features,
as the ``vision`` stage does, and once on *ideal* features that say nothing but which patches
hold ink (``InkEncoder``: count and side are all they show; colour, shape and size nothing).
Count and side questions about held-out pictures are scored by exact match.

Read the table so: where the ideal features are learnt and the CLIP's are not, the CLIP is
what is missing; where neither is learnt, the VLM needs more steps whatever it reads.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import Tensor, nn

from minimind_lib.course.profiles import get_profile
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.vision.clip import load_clip, patchify, to_pixels
from minimind_lib.vision.recipe import evaluate_vqa, train_vlm, with_vlm_steps
from minimind_lib.vision.scenes import BACKGROUND
from minimind_lib.vision.vlm import Projector, VisionLanguageModel

KINDS = ("count", "side")


class InkEncoder(nn.Module):
    """Ideal patch features (B, N, width): channel 0 is ``level`` where a patch holds a pixel
    far from the background colour, 0 elsewhere; the other channels are 0.

    >>> import numpy as np
    >>> picture = np.full((1, 16, 16, 3), BACKGROUND, dtype=np.uint8)
    >>> picture[0, 0, 9] = (200, 30, 30)                       # ink in the top-right patch
    >>> InkEncoder(width=4, patch_size=8).patch_features(to_pixels(picture))[0, :, 0].tolist()
    [0.0, 8.0, 0.0, 0.0]
    """

    def __init__(self, width: int, patch_size: int, embed_dim: int = 64,
                 level: float = 8.0) -> None:
        super().__init__()
        self.width, self.patch_size, self.level = width, patch_size, level
        self.embed_dim = embed_dim
        # the background colour as to_pixels normalises it, (3,)
        self.background = to_pixels(torch.tensor([[BACKGROUND]], dtype=torch.uint8))[0, :, 0, 0]

    def patch_features(self, pixels: Tensor) -> Tensor:
        patches = patchify(pixels, self.patch_size)  # (B, N, p*p*3), normalised
        # every ink is over 2 standard deviations from the background in some channel
        ink = (patches.unflatten(-1, (-1, 3)) - self.background).abs().amax(dim=(-2, -1)) > 1.0
        out = torch.zeros(*ink.shape, self.width)  # (B, N, width)
        out[..., 0] = ink.float() * self.level
        return out

    def pool(self, features: Tensor) -> Tensor:
        """No whole-picture summary (zeros, (B, embed_dim)): the oracle asks what the patches
        say."""
        return torch.zeros(features.shape[0], self.embed_dim)


def vlm_on(features: str, clip_dir: str, merge: int) -> VisionLanguageModel:
    clip = load_clip(clip_dir)
    config = clip.config
    encoder = (clip.image_encoder if features == "CLIP"
               else InkEncoder(config.vision_width, config.patch_size, config.embed_dim))
    lm = load_model("data/reference/sft")
    return VisionLanguageModel(lm, encoder,
                               Projector.for_encoder(config, lm.config.hidden_size, merge))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clip", help="a CLIP folder (runs/smoke/vision/clip)")
    parser.add_argument("--steps", type=int, nargs="+", default=[250, 500])
    parser.add_argument("--images", type=int, default=50, help="held-out pictures scored")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    settings = get_profile("smoke").vision
    print("| features | VLM steps | " + " | ".join(KINDS) + " | all held-out | train s |")
    print("|---|---|" + "---|" * (len(KINDS) + 2))
    for steps in args.steps:
        for features in ("CLIP", "ideal"):
            torch.manual_seed(0)
            vlm = vlm_on(features, args.clip, settings.merge)
            start = time.perf_counter()
            train_vlm(vlm, tokenizer, with_vlm_steps(settings, steps), seed=args.seed,
                      progress=False)
            took = time.perf_counter() - start
            score = evaluate_vqa(vlm, tokenizer, args.seed, args.images)["held_out"]
            print(f"| {features} | {steps} | "
                  + " | ".join(f"{score[k].exact_match:.1%}" for k in KINDS)
                  + f" | {score['all'].exact_match:.1%} | {took:.0f} |", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
