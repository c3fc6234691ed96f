"""A model folder ready to talk to: its tokenizer (``find_tokenizer``) and the model, text or
vision-language (``load_for_serving``), on the chosen device.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from minimind_lib.core.device import pick_device
from minimind_lib.core.filenames import TOKENIZER_FILE
from minimind_lib.model.checkpoint import load_model
from minimind_lib.model.hf import is_transformers_folder, load_pretrained
from minimind_lib.tokenizer.bpe import BPETokenizer, load_tokenizer
from minimind_lib.vision.vlm import is_vlm_folder, load_vlm

# --------------------------------------------------------------------------- loading a model


def find_tokenizer(model_dir: str | os.PathLike) -> BPETokenizer:
    """The tokenizer of a stage folder: its own ``tokenizer.json``, else the run's
    ``tokenizer`` stage beside it, else the course tokenizer (``data/tokenizer``)."""
    model_dir = Path(model_dir)
    for path in (model_dir / TOKENIZER_FILE, model_dir.parent / "tokenizer" / TOKENIZER_FILE):
        if path.is_file():
            return BPETokenizer.from_file(path)
    return load_tokenizer()


def load_for_serving(model_dir: str | os.PathLike,
                     device: str | torch.device | None = None) -> tuple[nn.Module, BPETokenizer]:
    """Model and tokenizer of ``model_dir``, ready to generate: a folder the course wrote (fp32
    or int8: ``checkpoint.load_model``; a VLM: ``vlm.load_vlm``), or a ``transformers`` folder
    or MiniMind ``.pth`` file (``hf.load_pretrained``: MiniMind's own exports). The tokenizer:
    ``find_tokenizer`` of the folder."""
    path, device = Path(model_dir), device or pick_device()
    if is_vlm_folder(path):
        model = load_vlm(path, device)
    elif path.is_file() or is_transformers_folder(path):
        model = load_pretrained(path).to(device).eval()
    else:
        model = load_model(path, device)
    tokenizer = find_tokenizer(path.parent if path.is_file() else path)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"{model_dir}: the tokenizer has {len(tokenizer)} tokens but the model "
                         f"only {model.config.vocab_size}")
    return model, tokenizer
