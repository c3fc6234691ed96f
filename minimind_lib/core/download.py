"""Fetch MiniMind's datasets and weights: the one place the course touches the network.

``python -m minimind_lib download data|model [--files SET|NAME...] [--name MODEL] [--to DIR]
[--source huggingface|modelscope]`` runs it, on purpose; nothing else downloads. What it fetches:

* ``data``: files of MiniMind's dataset repo ``jingyaogong/minimind_dataset`` (ModelScope:
  ``gongjy/minimind_dataset``) into ``--to`` (default ``$MINIMIND_DATA_DIR``, else
  ``data/minimind/``), where the ``full`` profile (and any profile, with ``MINIMIND_DATA_DIR``
  set) finds them. ``--files`` picks a set of ``DATA_FILE_SETS`` (default ``mini``: MiniMind's
  quick ``pretrain_t2t_mini``, ``sft_t2t_mini``, ``dpo`` and ``rlaif``) or names files;
  ``minimind2`` is the set MiniMind2 was trained on (``pretrain_hq``, ``sft_mini_512``), which
  MiniMind's dataset page no longer lists;
* ``model``: a released model as MiniMind exports it (a ``transformers`` folder) into ``--to``
  (default ``data/minimind/<name>``), for ``hf.load_pretrained``: ``--name MiniMind2-Small``
  (default; Llama), ``minimind-3`` or ``minimind-3-moe`` (Qwen3 / Qwen3-MoE).

The sizes are shown before anything starts; interrupted downloads resume (``huggingface_hub``
keeps partial files beside the target). With ``HF_HUB_OFFLINE=1`` the files come from the
local hub cache (``$HF_HUB_CACHE``) instead, and a file that is not there is an error naming it.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

from minimind_lib import DATA_DIR
from minimind_lib.core.device import human_bytes

# --- where the data lives -------------------------------------------------------------

#: MiniMind's own file names for each kind of record, in the order a data folder is searched:
#: MiniMind-3's quick file, its full one, then MiniMind2's (still read when present).
MINIMIND_FILES = {
    "pretrain": ("pretrain_t2t_mini.jsonl", "pretrain_t2t.jsonl", "pretrain_hq.jsonl"),
    "sft": ("sft_t2t_mini.jsonl", "sft_t2t.jsonl", "sft_mini_512.jsonl"),
    "dpo": ("dpo.jsonl",),
    "rl": ("rlaif.jsonl",),
    "agent_rl": ("agent_rl.jsonl", "agent_rl_math.jsonl"),
}
#: ``download data --files`` sets (MiniMind's dataset page, April 2026: sizes there are
#: 1.2 GB, 10 GB, 1.6 GB, 14 GB, 53 MB, 24 MB, 86 MB and 18 MB in this order).
CURRENT_DATA_FILES = ("pretrain_t2t_mini.jsonl", "pretrain_t2t.jsonl", "sft_t2t_mini.jsonl",
                      "sft_t2t.jsonl", "dpo.jsonl", "rlaif.jsonl", "agent_rl.jsonl",
                      "agent_rl_math.jsonl")
DATA_FILE_SETS = {
    "mini": ("pretrain_t2t_mini.jsonl", "sft_t2t_mini.jsonl", "dpo.jsonl", "rlaif.jsonl"),
    "full": ("pretrain_t2t.jsonl", "sft_t2t.jsonl", "dpo.jsonl", "rlaif.jsonl"),
    "agent": ("agent_rl.jsonl", "agent_rl_math.jsonl"),
    "all": CURRENT_DATA_FILES,
    "minimind2": ("pretrain_hq.jsonl", "sft_mini_512.jsonl", "dpo.jsonl"),
}
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


def _model_repos(name: str) -> dict[str, str]:
    """Where MiniMind publishes model ``name``, by source."""
    return {"huggingface": f"jingyaogong/{name}", "modelscope": f"gongjy/{name}"}


ARTIFACTS = {
    "data": Artifact("data", {"huggingface": "jingyaogong/minimind_dataset",
                              "modelscope": "gongjy/minimind_dataset"},
                     "dataset", DATA_FILE_SETS["mini"], DOWNLOAD_DIR),
    "model": Artifact("model", _model_repos("MiniMind2-Small"), "model", None,
                      DOWNLOAD_DIR / "MiniMind2-Small"),
}
#: ``download model --name``: MiniMind's released transformers folders, each fetched into
#: ``data/minimind/<name>`` (the MiniMind-3 repos follow MiniMind's README; no network here to
#: check the -moe one's name)
MODELS = ("MiniMind2-Small", "minimind-3", "minimind-3-moe")


def data_files(choice: Sequence[str] | None) -> tuple[str, ...]:
    """The file names ``--files`` asks for: set names and file names (``.jsonl`` optional).

    >>> data_files(None)
    ('pretrain_t2t_mini.jsonl', 'sft_t2t_mini.jsonl', 'dpo.jsonl', 'rlaif.jsonl')
    >>> data_files(["agent"]), data_files(["dpo", "rlaif.jsonl"])
    (('agent_rl.jsonl', 'agent_rl_math.jsonl'), ('dpo.jsonl', 'rlaif.jsonl'))
    >>> len(data_files(["mini", "agent", "dpo"]))   # sets and names together, each file once
    6
    """
    if not choice:
        return DATA_FILE_SETS["mini"]
    known = set(CURRENT_DATA_FILES) | set(DATA_FILE_SETS["minimind2"])
    names = [n for item in choice for n in DATA_FILE_SETS.get(item, (item,))]
    names = [n if n.endswith(".jsonl") else n + ".jsonl" for n in names]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown data file(s) {', '.join(unknown)}: choose a set "
                         f"({', '.join(DATA_FILE_SETS)}) or names among "
                         f"{', '.join(n.removesuffix('.jsonl') for n in sorted(known))}")
    return tuple(dict.fromkeys(names))


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
             repo_id: str | None = None, files: Sequence[str] | None = None,
             model: str | None = None, say: Callable[[str], None] = print) -> Path:
    """Fetch artifact ``name`` ("data" or "model") into ``to``; the folder it is in.
    ``files`` (data: a set or names, ``data_files``) and ``model`` (a ``MODELS`` name) choose
    what."""
    if name not in ARTIFACTS:
        raise ValueError(f"unknown download {name!r}; choose one of {', '.join(ARTIFACTS)}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    artifact = ARTIFACTS[name]
    if name == "data" and files:
        artifact = replace(artifact, files=data_files(files))
    if name == "model" and model is not None:
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
        artifact = replace(artifact, repos=_model_repos(model),
                           default_dir=artifact.default_dir.parent / model)
    dest = Path(to) if to is not None else default_dir(artifact)
    check_destination(dest)
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


def check_destination(dest: Path) -> None:
    """``--to`` must be a folder, or one that can be made: refused before anything is fetched
    (a file there, or a parent that is not a folder or cannot be written)."""
    if dest.exists() and not dest.is_dir():
        raise DownloadError(f"--to {dest}: a file is there, not a folder")
    parent = next((p for p in (dest, *dest.parents) if p.exists()), None)
    if parent is None or not parent.is_dir():
        raise DownloadError(f"--to {dest}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DownloadError(f"--to {dest}: {parent} cannot be written")


def check_reachable(endpoint: str | None = None, timeout: float = 5.0) -> None:
    """Fail fast, with what to do, when the hub's host cannot be reached (no network, no DNS):
    huggingface_hub would otherwise retry for half a minute and end in a ``ConnectError``."""
    url = urlparse(endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http"
                                                                 else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        raise DownloadError(
            f"cannot reach {host} ({e.strerror or e}): to work offline, set HF_HUB_OFFLINE=1 "
            "and point HF_HUB_CACHE at a hub cache that holds the files (or copy the files "
            "into --to yourself); --source modelscope uses another host") from None


def _huggingface(artifact: Artifact, repo_id: str, dest: Path,
                 say: Callable[[str], None]) -> Path:
    from huggingface_hub import hf_hub_download

    check_reachable()
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
