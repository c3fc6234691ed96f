"""On held-out pairs, which of colour and shape does the VLM get wrong, and does training data
that names one attribute without the other change that?

    python scripts/vision_shortcut.py runs/smoke/vision/clip --merge 2 --steps 500

Training shows each colour with three of the four shapes, so in the VQA training data a colour
is a hint about the shape and a shape a hint about the colour. The smoke profile's VLM (the
shipped reference chat model, a new projector, answer-only training on the frozen CLIP's
patch features) is trained once per *arm*, on the same CLIP:

* ``plain``: questions about pictures of the training pairs only;
* ``recoloured``: a share of the pictures in unnamed inks (``scenes.training_scene``),
  asked everything but their colour: shape without a colour;
* ``both`` (the stage's default): as ``recoloured``, and a further share of palette colours in
  shapes the course never names (ring, diamond), asked everything but their shape: colour
  without a shape.

Held-out questions are scored per kind by exact match (``vision.recipe.evaluate_vqa``). Read the
table so: where colour and shape trade places between arms, the VLM answers one of them from the
other (the shortcut); where both stay high, the extra data broke it.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from minimind_lib.course.profiles import get_profile
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.vision.clip import load_clip
from minimind_lib.vision.recipe import evaluate_vqa, train_vlm, with_vlm_steps
from minimind_lib.vision.scenes import QUESTION_KINDS
from minimind_lib.vision.vlm import build_vlm

ARMS = ("plain", "recoloured", "both")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clip", help="a CLIP folder (runs/smoke/vision/clip)")
    parser.add_argument("--merge", type=int, default=2,
                        help="the projector's merge: 2 for 8-pixel patches, 1 for 16")
    parser.add_argument("--steps", type=int, default=500, help="VLM steps")
    parser.add_argument("--share", type=float, default=0.3,
                        help="the recoloured (and the reshaped) share of the pictures")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--images", type=int, default=50, help="held-out pictures scored")
    parser.add_argument("--init-seed", type=int, default=0, help="the projector's")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    profile = get_profile("smoke")
    settings = replace(with_vlm_steps(profile.vision, args.steps), merge=args.merge)
    print("| arm | " + " | ".join(QUESTION_KINDS) + " | all held-out | train s |")
    print("|---|" + "---|" * (len(QUESTION_KINDS) + 2))
    for arm in args.arms:
        torch.manual_seed(args.init_seed)
        vlm = build_vlm(load_model("data/reference/sft"), load_clip(args.clip), args.merge)
        shares = replace(settings, recoloured=0.0 if arm == "plain" else args.share,
                         reshaped=args.share if arm == "both" else 0.0)
        start = time.perf_counter()
        train_vlm(vlm, tokenizer, shares, seed=args.seed, options=profile.train, progress=False)
        took = time.perf_counter() - start
        score = evaluate_vqa(vlm, tokenizer, args.seed, args.images)["held_out"]
        print(f"| {arm} | " + " | ".join(f"{score[k].exact_match:.1%}" for k in QUESTION_KINDS)
              + f" | {score['all'].exact_match:.1%} | {took:.0f} |", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
