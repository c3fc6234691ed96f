"""``ensure``: reuse a stage's output, or produce it (notebooks 04-08 and the CLI).

Each stage (``minimind_lib.stages``) writes ``<root>/<stage>/`` (``root`` defaults to
``runs/<profile>``) and, last of all, ``stage.json``: a summary plus a *fingerprint* of what
the output was made from (the profile's model and stage settings, the data files, the
prerequisites' runs). ``ensure`` returns the folder when that marker exists and its
fingerprint still matches; otherwise it ensures the prerequisites and runs the stage (with a
progress bar). The stages and their order come from the one registry, ``stages.STAGES``.

>>> [s.name for s in stages_in_all()]
['tokenizer', 'pretrain', 'sft', 'dpo', 'quantize']
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist

from minimind_lib.data import dataset_files
from minimind_lib.files import MARKER_FILE, atomic_write_text
from minimind_lib.profiles import Profile, get_profile
from minimind_lib.stages import STAGES, Stage, StageContext, get_stage, read_marker
from minimind_lib.train import init_distributed


def stages_in_all() -> list[Stage]:
    """The stages ``python -m minimind_lib all`` runs, in order."""
    return [s for s in STAGES.values() if s.in_all]


def fingerprint(stage: str, profile: Profile, root: Path) -> dict:
    """What a stage's output depends on; a mismatch with ``stage.json`` means: run again."""
    st = get_stage(stage)
    settings = getattr(profile, stage, None)
    files = dataset_files(st.data_schema) if st.data_schema else []
    fields = {
        "profile": profile.name, "seed": profile.seed, "model": profile.model.to_dict(),
        "settings": asdict(settings) if settings is not None else None,
        "data": [{"path": str(p), "bytes": p.stat().st_size} for p in files],
        "requires": {dep: (read_marker(root / dep) or {}).get("run_id") for dep in st.requires},
    }
    return json.loads(json.dumps(fields))  # as stage.json holds it (tuples become lists)


def is_complete(stage: str, profile: Profile, root: Path) -> bool:
    marker = read_marker(root / stage)
    return marker is not None and marker["fingerprint"] == fingerprint(stage, profile, root)


def ensure(stage: str, profile: Profile | str | None = None, *, root: str | Path | None = None,
           force: bool = False, resume: bool = False, device: str | None = None,
           precision: str = "auto", progress: bool = True,
           callbacks: list[Callable[[dict], None]] | tuple = ()) -> Path:
    """The output folder of ``stage`` for ``profile``, running it (and what it needs) if missing.

    ``force`` runs ``stage`` even when complete (prerequisites are still only ensured);
    ``resume`` continues an interrupted training stage from its last checkpoint.
    ``callbacks`` receive the stage's training metrics rows (e.g. a live loss plot).
    """
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    root = Path(root) if root is not None else profile.runs_dir
    st = get_stage(stage)
    for dep in st.requires:
        ensure(dep, profile, root=root, device=device, precision=precision, progress=progress)
    info = init_distributed()
    complete = [not force and is_complete(stage, profile, root)]
    if info.world_size > 1:  # rank 0 decides, so every rank takes the same branch
        dist.broadcast_object_list(complete, src=0)
    if complete[0]:
        return root / stage

    ctx = StageContext(stage, profile, root, resume, device, precision, progress, list(callbacks))
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    # one process at a time per stage folder (a notebook and a test may share runs/<profile>);
    # under torchrun the ranks run the stage together, so there is nothing to lock
    lock = _stage_lock(ctx.out_dir) if info.world_size == 1 else contextlib.nullcontext(False)
    with lock as waited:
        if waited and not force and is_complete(stage, profile, root):
            return ctx.out_dir  # another process finished it while we waited
        if info.is_main:
            print(f"[pipeline] stage {stage!r} (profile {profile.name}) -> {ctx.out_dir}")
            (ctx.out_dir / MARKER_FILE).unlink(missing_ok=True)
        t0 = time.time()
        summary = st.run(ctx) if st.distributed or info.is_main else {}
        if info.is_main:
            marker = {"stage": stage, "run_id": uuid.uuid4().hex,
                      "seconds": round(time.time() - t0, 1), "summary": summary,
                      "fingerprint": fingerprint(stage, profile, root)}
            atomic_write_text(ctx.out_dir / MARKER_FILE, json.dumps(marker, indent=2) + "\n")
    if info.world_size > 1:
        dist.barrier()
    return ctx.out_dir


@contextlib.contextmanager
def _stage_lock(stage_dir: Path) -> Iterator[bool]:
    """Hold an exclusive lock on ``stage_dir/.lock``; yield whether we had to wait for it."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; run one process at a time there
        yield False
        return
    with open(stage_dir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            print(f"[pipeline] waiting for another process running {stage_dir} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
            waited = True
        try:
            yield waited
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def find_model_dir(root: str | os.PathLike) -> Path:
    """The most trained finished stage under ``root`` (``runs/<profile>``) that holds a chat
    model: the last of the ``serves`` stages in stage order (dpo, else sft, else pretrain)
    whose ``stage.json`` marker exists."""
    root = Path(root)
    candidates = [s.name for s in STAGES.values() if s.serves][::-1]
    for stage in candidates:
        if read_marker(root / stage) is not None:
            return root / stage
    raise FileNotFoundError(
        f"no finished stage under {root} (looked for {', '.join(candidates)}); train one with "
        f"`python -m minimind_lib all --profile <profile>` or pass --model DIR")
