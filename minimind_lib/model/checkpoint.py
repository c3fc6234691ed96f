"""Checkpoints: safetensors weights + json config, atomic writes, strict loading (notebook 04).

Two kinds of files live here:

* a **model folder** (``save_model`` / ``load_model``): ``model.safetensors`` + ``config.json``
  (the ``MiniMindConfig`` fields as one flat json object), plus ``quantization.json`` when the
  model holds int8 layers (``minimind_lib.model.quantize``). Every stage's output is one.
* a **training checkpoint** (``save_checkpoint`` / ``load_checkpoint``): a model folder plus
  ``train_state.pt`` (optimizer, scaler, step, RNG states, data position), kept under
  ``<out>/checkpoints/step_NNNNNNN/`` with a ``latest`` pointer file.

Writes are atomic (``minimind_lib.core.filenames``). A checkpoint folder is written
whole under a temporary name and renamed, and only then does ``latest`` point at it, so a
kill at any moment leaves the previous checkpoint loadable.

Loading is strict: a missing, unexpected or wrongly-shaped tensor is an error naming the
file, never silently random weights. So are a damaged weights file, NaN or infinite weights,
and a ``config.json`` edited after saving (``save_model`` also records the config inside the
weights file, and ``load_model`` compares the two).

>>> import tempfile, torch
>>> d = tempfile.mkdtemp()
>>> net = torch.nn.Linear(3, 2)
>>> save_weights(net, f"{d}/w.safetensors")
>>> load_weights(torch.nn.Linear(3, 4), f"{d}/w.safetensors")
Traceback (most recent call last):
...
minimind_lib.model.checkpoint.CheckpointMismatchError: .../w.safetensors does not fit the model: ...
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import safetensors.torch
import torch
from torch import nn

from minimind_lib.core.atomic import atomic_path, atomic_write_text, disk_full_named, fsync_dir
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.device import check_fits
from minimind_lib.core.filenames import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    LATEST_FILE,
    QUANT_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
)
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.decoder import MiniMindForCausalLM, model_size
from minimind_lib.model.int8 import FORMAT as INT8_FORMAT
from minimind_lib.model.int8 import install_int8_layers, quantized_groups

#: The key of the model config in the safetensors header of a model folder's weights.
CONFIG_METADATA_KEY = "minimind_config"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file."""


class CheckpointMismatchError(CheckpointError):
    """Saved tensors do not fit the model (missing/unexpected keys or wrong shapes)."""


# --- weights and model folders ---------------------------------------------------------


def save_weights(module: nn.Module, path: str | Path,
                 metadata: dict[str, str] | None = None) -> None:
    """Save ``module``'s state dict as safetensors, atomically (``metadata`` goes in the header).

    subtle: tied tensors (``lm_head.weight`` is ``embed_tokens.weight``) share storage,
    which safetensors refuses to store twice; ``safetensors.torch.save_model`` keeps one
    name and ``load_model`` restores the tie.
    """
    with atomic_path(path) as tmp:
        safetensors.torch.save_model(module, str(tmp), metadata=metadata)


def load_weights(module: nn.Module, path: str | Path, device: str | torch.device = "cpu") -> None:
    """Load safetensors weights into ``module`` strictly; a mismatch names the file and keys,
    and a damaged file or a NaN/infinite weight is a ``CheckpointError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such weights file")
    try:
        safetensors.torch.load_model(module, str(path), strict=True, device=str(device))
    except safetensors.SafetensorError as e:  # cut short, overwritten, not safetensors at all
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); it is damaged "
                              f"or incomplete: save or copy it again") from None
    except RuntimeError as e:  # missing/unexpected keys or size mismatch from load_state_dict
        detail = " ".join(str(e).split())
        if not any(w in detail for w in ("Missing key", "Unexpected key", "size mismatch",
                                         "Error(s) in loading state_dict")):
            # a device problem (a CUDA device this machine lacks, out of memory), not the file
            raise RuntimeError(f"{path}: the weights could not be placed on {device}: "
                               f"{detail}") from None
        raise CheckpointMismatchError(f"{path} does not fit the model: {detail}") from None
    for name, tensor in module.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{path}: tensor {name!r} holds {bad:,} NaN or infinite "
                                  f"values; refusing to load a broken model")


def save_model(model: MiniMindForCausalLM, directory: str | Path) -> Path:
    """Write ``directory/config.json`` then ``directory/model.safetensors`` (each atomic); for a
    model with int8 layers (``quantize.quantize_int8``) also ``quantization.json``, last: a
    folder without it is read as a plain one, which then fails strictly, never half-int8."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / QUANT_FILE).unlink(missing_ok=True)  # a plain model replacing an int8 one
    config = model.config.to_dict()
    atomic_write_text(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    save_weights(model, directory / WEIGHTS_FILE, {CONFIG_METADATA_KEY: json.dumps(config)})
    groups = quantized_groups(model)
    if groups:
        atomic_write_text(directory / QUANT_FILE,
                          json.dumps({"format": INT8_FORMAT, "groups": groups}, indent=2) + "\n")
    return directory


def read_config(directory: str | Path) -> MiniMindConfig:
    """The ``MiniMindConfig`` stored in ``directory/config.json`` (unknown fields are an error)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (is {directory} a model folder?)")
    data = read_json(path)
    try:
        return MiniMindConfig.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def check_saved_config(directory: str | Path, config: MiniMindConfig) -> None:
    """Refuse a ``config.json`` that differs from the config ``save_model`` recorded in the
    weights file's header (a changed ``rope_theta`` or context would load silently and give
    wrong answers). Weights saved before the config was recorded carry none: nothing to check."""
    weights, config_path = Path(directory) / WEIGHTS_FILE, Path(directory) / CONFIG_FILE
    if not weights.is_file():
        return  # load_weights reports it
    try:
        with safetensors.safe_open(str(weights), "pt") as f:
            saved = (f.metadata() or {}).get(CONFIG_METADATA_KEY)
    except safetensors.SafetensorError as e:
        raise CheckpointError(f"{weights}: not a readable safetensors file ({e}); it is damaged "
                              f"or incomplete: save or copy it again") from None
    if saved is None:
        return
    saved, current = json.loads(saved), config.to_dict()
    diff = [f"{k} is {current[k]!r} there but {saved[k]!r} in the weights"
            for k in sorted(saved.keys() & current.keys()) if saved[k] != current[k]]
    if diff:
        raise CheckpointMismatchError(f"{config_path} does not match the config saved with "
                                      f"{weights.name}: {'; '.join(diff)}")


def _int8_groups(directory: Path) -> list[list[str]] | None:
    """The int8 module groups of ``directory`` (its ``quantization.json``), or None."""
    path = directory / QUANT_FILE
    if not path.is_file():
        return None
    meta = read_json(path)
    if meta.get("format") != INT8_FORMAT:
        raise ValueError(f"{path}: format is {meta.get('format')!r}, expected {INT8_FORMAT!r}")
    return meta.get("groups") or []


def load_model(directory: str | Path, device: str | torch.device = "cpu") -> MiniMindForCausalLM:
    """Rebuild the model ``save_model`` wrote (fp32/bf16 or int8); strict: the weights must fit
    the config (and the int8 groups) exactly."""
    directory = Path(directory)
    config = read_config(directory)
    check_saved_config(directory, config)
    params, nbytes = model_size(config)
    check_fits(nbytes, f"{directory / CONFIG_FILE} (a model of {params:,} parameters)", device)
    model = MiniMindForCausalLM(config)
    groups = _int8_groups(directory)
    if groups is not None:  # empty int8 modules of the right shapes; the weights come next
        install_int8_layers(model, groups, source=str(directory / QUANT_FILE))
    load_weights(model, directory / WEIGHTS_FILE, device=device)
    return model.to(device).eval()


# --- training checkpoints --------------------------------------------------------------


def _write_model_files(model: nn.Module, directory: Path) -> None:
    config = getattr(model, "config", None)
    if isinstance(config, MiniMindConfig):
        save_model(model, directory)  # a full model folder: load_model works on it
    else:  # any other module (tests' stand-ins): weights only
        save_weights(model, directory / WEIGHTS_FILE)


def save_checkpoint(
    out_dir: str | Path, step: int, model: nn.Module, state: dict, keep: int = 1,
    write_hook: Callable[[Path], None] | None = None,
) -> Path:
    """Save ``<out_dir>/checkpoints/step_<step>/`` and point ``latest`` at it.

    ``state`` (optimizer/scaler state dicts, RNG, data position, ...) goes to
    ``train_state.pt``; it must hold only tensors and plain Python values, so that
    ``load_checkpoint`` can read it with ``torch.load(weights_only=True)``.
    ``write_hook(tmp_dir)``, if given, runs after the files are written and before the
    rename (tests use it to simulate a crash mid-save). The ``keep`` newest checkpoints stay.
    """
    root = Path(out_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    final, tmp = root / name, root / f"{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with disk_full_named(tmp):
            _write_model_files(model, tmp)
            with atomic_path(tmp / STATE_FILE) as t:
                torch.save(state, t)
            if write_hook is not None:
                write_hook(tmp)
    except BaseException:  # a full disk, a kill signal: no half-written folder stays behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # the same step saved again (e.g. a resumed run that was complete)
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    atomic_write_text(root / LATEST_FILE, name + "\n")  # the commit point
    finished = sorted(p for p in root.glob("step_*") if ".tmp-" not in p.name)
    kept = set(finished[-keep:]) | {final}
    for old in root.glob("step_*"):  # older checkpoints and crashed saves' leftovers
        if old not in kept:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The folder ``latest`` points at, or None when no checkpoint was completed."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    pointer = root / LATEST_FILE
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{pointer} points at {path}, which holds no {STATE_FILE}")
    return path


def load_checkpoint(path: str | Path, model: nn.Module, device: str | torch.device = "cpu") -> dict:
    """Load a checkpoint's weights into ``model`` (strictly) and return its training state."""
    path = Path(path)
    if (isinstance(getattr(model, "config", None), MiniMindConfig)
            and (path / CONFIG_FILE).is_file()):
        saved = read_config(path)
        if saved != model.config:
            diff = {k: (v, getattr(model.config, k)) for k, v in saved.to_dict().items()
                    if getattr(model.config, k) != v}
            raise CheckpointMismatchError(
                f"{path / CONFIG_FILE} was saved for another model config; "
                f"differences (saved, current): {diff}")
    load_weights(model, path / WEIGHTS_FILE, device=device)
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{path / STATE_FILE}: cannot be read ({e})") from None
