"""Fetch MiniMind's datasets and weights: the one place the course touches the network.

``python -m minimind_lib download data|model [--to DIR] [--source huggingface|modelscope]``
runs it, on purpose; nothing else downloads. What it fetches:

* ``data``: MiniMind's ``pretrain_hq.jsonl``, ``sft_mini_512.jsonl`` and ``dpo.jsonl`` from the
  dataset repo ``jingyaogong/minimind_dataset`` (ModelScope: ``gongjy/minimind_dataset``) into
  ``--to`` (default ``$MINIMIND_DATA_DIR``, else ``data/minimind/``), where the ``full``
  profile (and any profile, with ``MINIMIND_DATA_DIR`` set) finds them;
* ``model``: MiniMind2-Small as MiniMind exports it (a ``transformers`` Llama folder:
  ``jingyaogong/MiniMind2-Small``; ModelScope ``gongjy/MiniMind2-Small``) into ``--to``
  (default ``data/minimind/MiniMind2-Small``), for ``hf.load_pretrained``.

The sizes are shown before anything starts; interrupted downloads resume (``huggingface_hub``
keeps partial files beside the target). With ``HF_HUB_OFFLINE=1`` the files come from the
local hub cache (``$HF_HUB_CACHE``) instead, and a file that is not there is an error naming it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minimind_lib import DATA_DIR
from minimind_lib.core.device import human_bytes

# --- where the data lives -------------------------------------------------------------

#: MiniMind's own file names, used when ``$MINIMIND_DATA_DIR`` points at them.
MINIMIND_FILES = {"pretrain": "pretrain_hq.jsonl", "sft": "sft_mini_512.jsonl", "dpo": "dpo.jsonl"}
#: Where ``python -m minimind_lib download data`` puts MiniMind's files by default.
DOWNLOAD_DIR = DATA_DIR / "minimind"

SOURCES = ("huggingface", "modelscope")


@dataclass(frozen=True)
class Artifact:
    """Something ``download`` knows how to fetch."""

    name: str
    repos: dict[str, str]  # source -> repo id
    repo_type: str  # "dataset" | "model"
    files: tuple[str, ...] | None  # None: every file of the repo
    default_dir: Path


ARTIFACTS = {
    "data": Artifact("data", {"huggingface": "jingyaogong/minimind_dataset",
                              "modelscope": "gongjy/minimind_dataset"},
                     "dataset", tuple(MINIMIND_FILES.values()), DOWNLOAD_DIR),
    "model": Artifact("model", {"huggingface": "jingyaogong/MiniMind2-Small",
                                "modelscope": "gongjy/MiniMind2-Small"},
                      "model", None, DOWNLOAD_DIR / "MiniMind2-Small"),
}


class DownloadError(OSError):
    """What to fetch is not available (offline and not cached, unknown repo, missing extra)."""


def default_dir(artifact: Artifact) -> Path:
    """Where ``artifact`` goes when ``--to`` is not given."""
    env = os.environ.get("MINIMIND_DATA_DIR")
    return Path(env) if env and artifact.name == "data" else artifact.default_dir


def offline() -> bool:
    """True when ``huggingface_hub`` must not touch the network (``HF_HUB_OFFLINE=1``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_cache() -> str | None:
    """``$HF_HUB_CACHE`` read now (huggingface_hub reads it once, when first imported)."""
    return os.environ.get("HF_HUB_CACHE") or None


def cached_files(artifact: Artifact, repo_id: str | None = None) -> dict[str, Path]:
    """``artifact``'s files in the local hub cache (``try_to_load_from_cache``), by name."""
    from huggingface_hub import try_to_load_from_cache

    repo_id = repo_id or artifact.repos["huggingface"]
    names, cache = artifact.files, _hub_cache()
    if names is None:  # a whole repo: list the cached snapshot that holds its config
        config = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache,
                                        repo_type=artifact.repo_type)
        if not isinstance(config, str):
            raise DownloadError(f"{repo_id} is not in the local hub cache and HF_HUB_OFFLINE=1 "
                                "forbids downloading it; unset HF_HUB_OFFLINE to download")
        snapshot = Path(config).parent
        return {p.relative_to(snapshot).as_posix(): p for p in sorted(snapshot.rglob("*"))
                if p.is_file()}
    found, missing = {}, []
    for name in names:
        path = try_to_load_from_cache(repo_id, name, cache_dir=cache, repo_type=artifact.repo_type)
        if isinstance(path, str):
            found[name] = Path(path)
        else:
            missing.append(name)
    if missing:
        raise DownloadError(f"{', '.join(missing)} of {repo_id} not in the local hub cache and "
                            "HF_HUB_OFFLINE=1 forbids downloading; unset HF_HUB_OFFLINE")
    return found


def remote_sizes(artifact: Artifact, repo_id: str) -> dict[str, int]:
    """File name -> bytes, as the Hugging Face Hub lists them (before downloading)."""
    from huggingface_hub import HfApi

    api = HfApi()
    if artifact.files is None:
        entries = api.list_repo_tree(repo_id, repo_type=artifact.repo_type, recursive=True)
    else:
        entries = api.get_paths_info(repo_id, list(artifact.files), repo_type=artifact.repo_type)
    sizes = {e.path: e.size for e in entries if getattr(e, "size", None) is not None}
    missing = set(artifact.files or ()) - set(sizes)
    if missing:
        raise DownloadError(f"{repo_id} has no {', '.join(sorted(missing))}")
    return sizes


def download(name: str, to: str | os.PathLike | None = None, *, source: str = "huggingface",
             repo_id: str | None = None, say: Callable[[str], None] = print) -> Path:
    """Fetch artifact ``name`` ("data" or "model") into ``to``; the folder it is in."""
    if name not in ARTIFACTS:
        raise ValueError(f"unknown download {name!r}; choose one of {', '.join(ARTIFACTS)}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    artifact = ARTIFACTS[name]
    dest = Path(to) if to is not None else default_dir(artifact)
    repo_id = repo_id or artifact.repos[source]
    if source == "modelscope":
        return _modelscope(artifact, repo_id, dest, say)
    if offline():
        files = cached_files(artifact, repo_id)
        total = sum(p.stat().st_size for p in files.values())
        say(f"{repo_id}: {len(files)} file(s), {human_bytes(total)}, from the local hub cache "
            f"(HF_HUB_OFFLINE=1) -> {dest}")
        for rel, path in files.items():
            target = dest / rel
            if not (target.is_file() and target.stat().st_size == path.stat().st_size):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)  # the cache holds symlinks to blobs: copy data
            say(f"  {rel} ({human_bytes(path.stat().st_size)})")
        return dest
    return _huggingface(artifact, repo_id, dest, say)


def _huggingface(artifact: Artifact, repo_id: str, dest: Path,
                 say: Callable[[str], None]) -> Path:
    from huggingface_hub import hf_hub_download

    sizes = remote_sizes(artifact, repo_id)
    say(f"{repo_id}: {len(sizes)} file(s), {human_bytes(sum(sizes.values()))} -> {dest} "
        "(resumable: run again to continue an interrupted download)")
    for rel, size in sizes.items():
        say(f"  {rel} ({human_bytes(size)})")
        hf_hub_download(repo_id, rel, repo_type=artifact.repo_type, local_dir=dest)
    return dest


def _modelscope(artifact: Artifact, repo_id: str, dest: Path, say: Callable[[str], None]) -> Path:
    try:
        from modelscope.hub.snapshot_download import dataset_snapshot_download, snapshot_download
    except ImportError:
        raise DownloadError("--source modelscope needs the modelscope package: "
                            "pip install -e '.[modelscope]'") from None
    say(f"{repo_id} (ModelScope) -> {dest}")
    patterns = list(artifact.files) if artifact.files else None
    if artifact.repo_type == "dataset":
        dataset_snapshot_download(repo_id, local_dir=str(dest), allow_patterns=patterns)
    else:
        snapshot_download(repo_id, local_dir=str(dest), allow_patterns=patterns)
    return dest
