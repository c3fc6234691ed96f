"""Device and precision choice, and seeding (notebook 00, used by every stage).

The rule, in one place:

* device: CUDA if present, else Apple MPS, else CPU;
* precision on CUDA: bf16 autocast where the GPU supports it (Ampere and newer),
  else fp16 autocast *with* a ``GradScaler`` (fp16's narrow exponent range makes small
  gradients underflow to zero unless the loss is scaled up first, notebook 04);
* precision on CPU: bf16 autocast where the CPU has native bf16 instructions
  (AVX512-BF16 or AMX; ``benchmarks/train_bench.py`` measures how much faster it is on your
  machine, docs/benchmarks.md records ours), else plain fp32 (emulated bf16 is slower);
* precision on MPS: fp32 (autocast support there is partial and version dependent).

bf16 keeps fp32's exponent range, so it never needs a scaler.

>>> p = pick_precision(torch.device("cpu"), cpu_bf16=False)
>>> (p.name, p.dtype, p.use_scaler)
('fp32', torch.float32, False)
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    """How the forward pass runs: autocast dtype (or none) and whether to scale the loss."""

    name: str  # "fp32" | "bf16" | "fp16"
    dtype: torch.dtype  # compute dtype inside autocast (float32 = no autocast)
    use_scaler: bool  # True only for fp16

    @property
    def autocast(self) -> bool:
        return self.dtype != torch.float32

    def context(self, device: torch.device):
        """``torch.autocast`` for this precision, or a no-op context for fp32."""
        return torch.autocast(device_type=device.type, dtype=self.dtype, enabled=self.autocast)


FP32 = Precision("fp32", torch.float32, False)
BF16 = Precision("bf16", torch.bfloat16, False)
FP16 = Precision("fp16", torch.float16, True)
_BY_NAME = {"fp32": FP32, "bf16": BF16, "fp16": FP16}


def pick_device(name: str | None = None) -> torch.device:
    """CUDA → MPS → CPU, unless ``name`` (or ``$MINIMIND_DEVICE``) says which.

    >>> pick_device("cpu")
    device(type='cpu')
    """
    name = name or os.environ.get("MINIMIND_DEVICE")
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


#: ``0`` trains as on a CPU without native bf16 (fp32), ``1`` as on one with it; unset: detected
CPU_BF16_ENV = "MINIMIND_CPU_BF16"


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """True when the CPU executes bf16 matrix math natively (AVX512-BF16 or AMX-BF16).

    ``$MINIMIND_CPU_BF16`` (``0`` or ``1``) replaces the detection, so a machine with bf16 can
    run a notebook as a laptop without it does (``benchmarks/quoted_spread.py`` uses it).
    """
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"${CPU_BF16_ENV} is {forced!r}; set it to 0 (no native bf16: fp32) "
                             "or 1 (native bf16), or unset it to detect the CPU")
        return forced == "1"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:  # macOS / Windows: no cpuinfo; Apple silicon and most laptops lack it
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_precision(
    device: torch.device,
    requested: str = "auto",
    *,
    cpu_bf16: bool | None = None,
    cuda_bf16: bool | None = None,
) -> Precision:
    """Choose the training precision for ``device``.

    ``requested`` is one of ``PRECISIONS``; "auto" applies the rule in the module
    docstring.  ``cpu_bf16`` / ``cuda_bf16`` override hardware detection (for tests).

    >>> pick_precision(torch.device("cuda"), cuda_bf16=False).name
    'fp16'
    >>> pick_precision(torch.device("cpu"), "fp16").use_scaler
    True
    """
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; choose one of {', '.join(PRECISIONS)}")
    if requested != "auto":
        return _BY_NAME[requested]
    if device.type == "cuda":
        if cuda_bf16 is None:
            cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return BF16 if cuda_bf16 else FP16
    if device.type == "cpu":
        if cpu_bf16 is None:
            cpu_bf16 = cpu_has_native_bf16()
        return BF16 if cpu_bf16 else FP32
    return FP32


#: Seeds are 32-bit: NumPy's generator takes nothing larger
MAX_SEED = 2**32 - 1


def check_seed(seed: object, name: str = "seed") -> None:
    """Refuse a seed ``seed_everything`` cannot take, naming the setting.

    >>> check_seed(2**32)
    Traceback (most recent call last):
    ...
    ValueError: seed must be an integer in [0, 4294967295], got 4294967296
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must be an integer in [0, {MAX_SEED}], got {seed!r}")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so runs repeat exactly on CPU."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


# --- RNG state (for bit-exact resume) ----------------------------------------------------


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as tensors and plain values (``weights_only``-safe)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                       "has_gauss": has_gauss, "gauss": gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of ``rng_state``."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- memory (checked before anything is allocated) --------------------------------------------


class TooLargeError(ValueError):
    """What a setting or a file asks for does not fit this machine's memory."""


def free_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes that can still be allocated on ``device``: CUDA's free memory, else what the OS
    reports available (Linux ``MemAvailable``, else the physical memory); None when unknown."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # Windows, or an OS without the names
        return None


def human_bytes(n: float) -> str:
    """``3.2e9 -> '3.2 GB'``.

    >>> human_bytes(1536), human_bytes(2.7e11), human_bytes(4e21)
    ('1.5 KB', '270.0 GB', '4.0e+21 bytes')
    """
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= 1e15:
            return f"{n:.1e} bytes"
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def check_fits(needed: int, what: str, device: torch.device | str | None = None) -> None:
    """Refuse ``needed`` bytes for ``what`` (naming the file or setting) when ``device`` has
    less free, before anything is allocated."""
    free = free_memory(device)
    if free is not None and needed > free:
        where = "this GPU" if torch.device(device or "cpu").type == "cuda" else "this machine"
        raise TooLargeError(f"{what} needs about {human_bytes(needed)}; {where} has "
                            f"{human_bytes(free)} free")
