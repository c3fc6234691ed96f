"""The versions the course was tested with (``constraints.txt``) beside the ones installed.

``make setup`` installs through the lock, so a fresh ``.venv`` matches it; another environment
(a conda env, a system Python, a newer torch) may not, and then the figures the notebooks quote
may differ. Notebook 00 prints what differs; ``scripts/lock_drift.py`` does so from a shell.

The lock is a pip constraints file: ``name==version`` lines, each with an optional environment
marker (``; sys_platform == 'linux'``) saying where it applies.

>>> lock = parse_lock("torch==2.13.0\\n    # via minimind\\n"
...                   "nvidia-cublas==13.1 ; sys_platform == 'nt'\\n")
>>> lock["torch"]
'2.13.0'
>>> "nvidia-cublas" in lock      # its marker does not hold here
False
>>> same_release("2.13.0+cpu", "2.13.0")   # a local build of the locked release
True
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

#: the lock, beside pyproject.toml (absent when the library was installed from a wheel)
LOCK_FILE = Path(__file__).resolve().parents[2] / "constraints.txt"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;(.*))?$")


@dataclass(frozen=True)
class Drift:
    """One package whose installed version is not the locked one."""

    name: str
    installed: str
    locked: str


def lock_pins(text: str) -> list[tuple[str, str, str]]:
    """Every pin of the lock as ``(canonical name, version, marker or "")``, on every platform
    (a name appears once per platform fork)."""
    pins = []
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match is not None:
            name, version, marker = match.groups()
            pins.append((canonicalize_name(name), version, (marker or "").strip()))
    return pins


def parse_lock(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of the lock's pins whose marker holds on this interpreter."""
    return {name: version for name, version, marker in lock_pins(text)
            if not marker or Marker(marker).evaluate()}


def same_release(installed: str, locked: str) -> bool:
    """Equal versions, ignoring a local label (``2.13.0+cpu`` is a build of ``2.13.0``)."""
    try:
        return Version(installed).public == Version(locked).public
    except InvalidVersion:
        return installed == locked


def lock_drift(path: Path = LOCK_FILE) -> list[Drift] | None:
    """Every installed package the lock pins at another version (sorted by name); ``None`` when
    there is no lock file. Packages the lock pins but this environment lacks are not drift: the
    lock covers every extra and platform, and each install takes only what it needs."""
    if not path.is_file():
        return None
    locked = parse_lock(path.read_text(encoding="utf-8"))
    drift = []
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name in locked and not same_release(dist.version, locked[name]):
            drift.append(Drift(name, dist.version, locked[name]))
    return sorted(set(drift), key=lambda d: d.name)
