"""``ensure``: reuse a stage's output, or produce it (notebooks 04-08 and the CLI).

Each stage (``minimind_lib.course.stages``) writes ``<root>/<stage>/`` (``root`` defaults to
``runs/<profile>``): first ``run_config.json`` (the fully resolved settings it runs with),
last of all ``stage.json``: a summary plus a *fingerprint* of what the output was made from:
the profile's model and stage settings, the seed, each input file by name and content hash,
and the prerequisites' run ids. Nothing machine-specific enters it (no absolute path, host or
device), so a runs folder stays valid when the course folder moves or a second clone uses it.

``ensure`` says what it decides, in one line:

* the marker exists and its fingerprint matches: **reuse** (stage, run id, when it finished);
* it differs: **rebuild**, listing what changed (``settings.learning_rate 0.001 -> 0.002``,
  ``data sft_sample.jsonl changed``, ``requires.pretrain <run> -> <run>``). The finished
  folder is never deleted: it moves to ``<root>/previous/<stage>-<run id>/`` first
  (``python -m minimind_lib runs`` lists what is kept and its size; ``runs --clean`` removes
  it). ``force=True`` rebuilds on purpose, keeping the previous run the same way.

Stages that depend on a rebuilt stage see a new prerequisite run id, so they rebuild too.
The stages and their order come from the one registry, ``stages.STAGES``.

>>> [s.name for s in stages_in_all()]
['tokenizer', 'pretrain', 'sft', 'dpo', 'quantize']
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist

from minimind_lib import DATA_DIR
from minimind_lib.core.atomic import atomic_write_text
from minimind_lib.core.checked_files import read_json
from minimind_lib.core.device import check_fits, pick_device
from minimind_lib.core.filenames import (
    CONFIG_FILE,
    MARKER_FILE,
    RUN_CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
)
from minimind_lib.course.profiles import Profile, get_profile
from minimind_lib.course.stages import STAGES, Stage, StageContext, get_stage, read_marker
from minimind_lib.model.checkpoint import read_config
from minimind_lib.model.decoder import model_size
from minimind_lib.tokenizer.bpe import load_tokenizer
from minimind_lib.training.distributed import init_distributed
from minimind_lib.training.memory import CUDA_OVERHEAD_BYTES, training_memory
from minimind_lib.training.settings import TrainSettings

PREVIOUS_DIR = "previous"  # <root>/previous/<stage>-<run id>/: finished runs moved aside
HASH_CACHE = ".hashes.json"  # <root>/.hashes.json: content hashes by path, size and mtime
#: The shipped chat model: the cpu profile's SFT stage in bf16 (``make reference``), what the
#: notebooks show before a student has trained a model of their own.
REFERENCE_MODEL = DATA_DIR / "reference" / "sft"


def stages_in_all() -> list[Stage]:
    """The stages ``python -m minimind_lib all`` runs, in order."""
    return [s for s in STAGES.values() if s.in_all]


def with_prerequisites(stages: list[str]) -> list[Stage]:
    """``stages`` and every stage they require, directly or not, each once.

    >>> [s.name for s in with_prerequisites(["dpo"])]
    ['dpo', 'tokenizer', 'sft', 'pretrain']
    """
    todo, seen = list(stages), {}
    while todo:
        st = get_stage(todo.pop(0))
        if st.name not in seen:
            seen[st.name] = st
            todo += st.requires
    return list(seen.values())


def check_data(stages: list[str], profile: Profile) -> None:
    """Raise ``FileNotFoundError`` (naming the profile and the ``download`` command) when a file
    that ``stages`` or their prerequisites read is missing; before anything starts."""
    for st in with_prerequisites(stages):
        try:
            st.inputs(profile)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"profile {profile.name}: {e}") from None


def check_memory(stages: list[str], profile: Profile, device: str | None = None) -> None:
    """Refuse, before anything starts, a profile whose training of ``stages`` (and their
    prerequisites) cannot fit this machine: the model's weights, gradients, AdamW state and
    one micro-batch's activations (``training.memory.training_memory``), naming the stage and
    the settings that size it, so an absurd ``--set model.hidden_size=...`` is never
    allocated."""
    target = pick_device(device)
    for st in with_prerequisites(stages):
        settings = st.settings_in(profile)
        if not isinstance(settings, TrainSettings):
            continue
        needed = training_memory(profile.model, settings.batch_size, settings.seq_len,
                                 "bf16" if target.type == "cuda" else "fp32",
                                 overhead=CUDA_OVERHEAD_BYTES if target.type == "cuda" else 0)
        params = model_size(profile.model)[0]
        check_fits(needed, f"profile {profile.name}: training {st.name} (a model of "
                           f"{params:,} parameters, {st.settings}.batch_size "
                           f"{settings.batch_size} x seq_len {settings.seq_len})", target)


# --- fingerprints ---------------------------------------------------------------------------


def file_hash(path: Path, cache_root: Path | None = None) -> str:
    """SHA-256 of a file's content, remembered in ``<cache_root>/.hashes.json`` by resolved
    path, size and modification time, so a multi-GB dataset is hashed once, not per call."""
    stat = path.stat()
    key, stamp = str(path.resolve()), [stat.st_size, stat.st_mtime_ns]
    cache_file = cache_root / HASH_CACHE if cache_root is not None else None
    cache: dict = {}
    if cache_file is not None and cache_file.is_file():
        with contextlib.suppress(ValueError):  # a damaged cache is rebuilt, never trusted
            cache = read_json(cache_file)
        if not all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                   for v in cache.values()):
            cache = {}
    if cache.get(key, {}).get("stamp") == stamp:
        return cache[key]["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if cache_file is not None:
        cache[key] = {"stamp": stamp, "sha256": digest.hexdigest()}
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache_file, json.dumps(cache, indent=1) + "\n")
    return digest.hexdigest()


def fingerprint(stage: str, profile: Profile, root: Path, init: Path | None = None) -> dict:
    """What a stage's output depends on; a mismatch with ``stage.json`` means: run again.
    Input files enter by name (relative to their data folder) and content hash; a prerequisite
    by its run id, or, replaced by ``--init``, by the content hash of the weights it starts from."""
    st = get_stage(stage)
    settings = st.settings_in(profile)
    requires = {dep: (read_marker(root / dep) or {}).get("run_id") for dep in _needs(st, init)}
    if init is not None:
        requires["init"] = file_hash(Path(init) / WEIGHTS_FILE, root)
    fields = {
        "profile": profile.name, "seed": profile.seed, "model": profile.model.to_dict(),
        "settings": asdict(settings) if settings is not None else None,
        "data": {p.name: file_hash(p, root) for p in st.inputs(profile)},
        "requires": requires,
    }
    if st.evaluates:  # what its eval.json measures (a stage that scores nothing keeps its runs)
        fields["eval_per_task"] = profile.eval_per_task
    return json.loads(json.dumps(fields))  # as stage.json holds it (tuples become lists)


def _needs(st: Stage, init: Path | None) -> tuple[str, ...]:
    """The prerequisites to ensure: all of them, but the one ``--init`` replaces."""
    return tuple(d for d in st.requires if init is None or d != st.starts_from)


def differences(old: object, new: object, prefix: str = "") -> list[str]:
    """What changed between two fingerprints, one phrase per leaf.

    >>> differences({"settings": {"lr": 1e-3, "steps": 5}, "data": {"a.jsonl": "x"}},
    ...             {"settings": {"lr": 2e-3, "steps": 5}, "data": {"a.jsonl": "y"}})
    ['settings.lr 0.001 -> 0.002', 'data a.jsonl changed']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in dict.fromkeys([*old, *new]):
            path = f"{prefix}.{key}" if prefix else str(key)
            if prefix == "data":
                if old.get(key) != new.get(key):
                    state = ("added" if key not in old else "removed" if key not in new
                             else "changed")
                    out.append(f"data {key} {state}")
            else:
                out += differences(old.get(key), new.get(key), path)
        return out
    return [] if old == new else [f"{prefix} {_short(old)} -> {_short(new)}"]


def _short(value: object) -> str:
    text = json.dumps(value) if isinstance(value, dict | list) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_complete(stage: str, profile: Profile, root: Path, init: Path | None = None) -> bool:
    marker = read_marker(root / stage)
    return marker is not None and marker.get("fingerprint") == fingerprint(stage, profile, root,
                                                                           init)


# --- ensure -----------------------------------------------------------------------------------


def ensure(stage: str, profile: Profile | str | None = None, *, root: str | Path | None = None,
           force: bool = False, resume: bool = False, device: str | None = None,
           precision: str = "auto", progress: bool = True,
           callbacks: list[Callable[[dict], None]] | tuple = (),
           init: str | Path | None = None, _ensured: set[str] | None = None) -> Path:
    """The output folder of ``stage`` for ``profile``, running it (and what it needs) if missing.

    ``force`` runs ``stage`` even when complete (prerequisites are still only ensured; the
    previous run is kept in ``<root>/previous/``); ``resume`` continues an interrupted
    training stage from its last checkpoint. ``callbacks`` receive the stage's training
    metrics rows (e.g. a live loss plot). ``init`` (a model folder, e.g. the shipped
    ``data/reference/sft``) replaces the model the stage starts from: its ``starts_from``
    prerequisite is then neither needed nor run.
    """
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    root = Path(root) if root is not None else profile.runs_dir
    st = get_stage(stage)
    if _ensured is None:  # the call a user made: check the whole chain once, before any work
        check_memory([stage], profile, device)
    init = _check_init(st, init)
    ensured = set() if _ensured is None else _ensured  # each prerequisite once per call
    for dep in _needs(st, init):
        if dep not in ensured:
            ensure(dep, profile, root=root, device=device, precision=precision,
                   progress=progress, _ensured=ensured)
            ensured.add(dep)
    info = init_distributed()
    decision = [None if force else _decide(stage, profile, root, init)]
    if info.world_size > 1:  # rank 0 decides, so every rank takes the same branch
        dist.broadcast_object_list(decision, src=0)
    if decision[0] == "reuse":
        return root / stage

    ctx = StageContext(stage, profile, root, resume, device, precision, progress, list(callbacks),
                       init)
    # one process at a time per stage (a notebook and a test may share runs/<profile>); the lock
    # file sits beside the stage folder, so moving the folder aside never moves the lock.
    # Under torchrun the ranks run the stage together, so there is nothing to lock
    lock = (_stage_lock(root / f".{stage}.lock") if info.world_size == 1
            else contextlib.nullcontext(False))
    with lock as waited:
        if waited and not force and is_complete(stage, profile, root, init):
            return ctx.out_dir  # another process finished it while we waited
        _check_inputs(st, root, init)  # a damaged input stops the run before anything moves
        if info.is_main and not resume:  # under the lock: a run finished meanwhile is kept too
            _keep_previous(ctx.out_dir, root, "forced" if force else None)
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        if info.is_main:
            print(f"[pipeline] stage {stage!r} (profile {profile.name}) -> {ctx.out_dir}")
            (ctx.out_dir / MARKER_FILE).unlink(missing_ok=True)
            _write_run_config(ctx)
        t0 = time.time()
        summary = st.run(ctx) if st.distributed or info.is_main else {}
        if info.is_main:
            marker = {"stage": stage, "run_id": uuid.uuid4().hex,
                      "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "seconds": round(time.time() - t0, 1), "summary": summary,
                      "fingerprint": fingerprint(stage, profile, root, init)}
            atomic_write_text(ctx.out_dir / MARKER_FILE, json.dumps(marker, indent=2) + "\n")
    if info.world_size > 1:
        dist.barrier()
    return ctx.out_dir


def _check_inputs(st: Stage, root: Path, init: Path | None) -> None:
    """Read what the stage will read from earlier stages (the tokenizer, the model it starts
    from) before its finished folder is moved aside: a damaged file is an error naming it while
    the last good run is still in place (issue 49)."""
    tokenizer = root / "tokenizer" / TOKENIZER_FILE
    if st.name != "tokenizer" and tokenizer.is_file():
        try:
            load_tokenizer(tokenizer)
        except (ValueError, OSError) as e:
            raise ValueError(f"{e} (the {st.name!r} stage reads it; rebuild it with "
                             f"`python -m minimind_lib tokenizer --out {root}`)") from None
    start = init or (root / st.starts_from if st.starts_from else None)
    if start is not None and (start / CONFIG_FILE).is_file():
        read_config(start)  # a damaged config.json names itself
        if not (start / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{start / WEIGHTS_FILE}: the model the {st.name!r} stage "
                                    "starts from has no weights")


def _check_init(st: Stage, init: str | Path | None) -> Path | None:
    if init is None:
        return None
    if st.starts_from is None:
        starting = [s.name for s in STAGES.values() if s.starts_from]
        raise ValueError(f"--init does not apply to stage {st.name!r}: it starts from no model "
                         f"(stages that do: {', '.join(starting)})")
    init = Path(init)
    if not (init / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"--init {init}: no {WEIGHTS_FILE} there (a model folder such "
                                "as data/reference/sft or runs/cpu/sft)")
    return init


def _decide(stage: str, profile: Profile, root: Path, init: Path | None = None) -> str:
    """"reuse" (and say so) or "run" (and say why), for ``ensure``."""
    marker = read_marker(root / stage)
    if marker is None:
        return "run"
    current = fingerprint(stage, profile, root, init)
    changes = differences(marker.get("fingerprint") or {}, current)
    if not changes:
        print(f"[pipeline] reusing {stage!r}: run {marker['run_id'][:8]}, finished "
              f"{marker.get('finished_at', '?')} ({marker['seconds'] / 60:.1f} min) in "
              f"{root / stage}")
        return "reuse"
    print(f"[pipeline] {stage!r} must be rebuilt: {'; '.join(changes)}")
    return "run"


def _keep_previous(stage_dir: Path, root: Path, reason: str | None) -> None:
    """Move a finished stage folder aside (``<root>/previous/<stage>-<run id>``) before it is
    rebuilt; an unfinished one (no marker: a crashed run, checkpoints for ``--resume``) stays."""
    marker = read_marker(stage_dir)
    if marker is None:
        return
    target = root / PREVIOUS_DIR / f"{stage_dir.name}-{str(marker.get('run_id', 'unknown'))[:8]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)  # the same run kept twice: the copy there is identical
    os.replace(stage_dir, target)
    why = f" ({reason})" if reason else ""
    print(f"[pipeline] kept the previous {stage_dir.name!r} run{why} in {target}")


def _write_run_config(ctx: StageContext) -> None:
    """``run_config.json``: everything the stage runs with, resolved (the manual's config)."""
    profile, settings = ctx.profile, get_stage(ctx.stage).settings_in(ctx.profile)
    config = {"stage": ctx.stage, "profile": profile.name, "overrides": list(profile.overrides),
              "seed": profile.seed, "model": profile.model.to_dict(),
              "settings": asdict(settings) if settings is not None else None,
              "train": asdict(profile.train), "precision": ctx.precision, "device": ctx.device,
              "data": [str(p) for p in get_stage(ctx.stage).inputs(profile)],
              "requires": {d: str(ctx.dir(d)) for d in _needs(get_stage(ctx.stage), ctx.init)},
              "init": str(ctx.init) if ctx.init is not None else None}
    atomic_write_text(ctx.out_dir / RUN_CONFIG_FILE, json.dumps(config, indent=2) + "\n")


@contextlib.contextmanager
def _stage_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on the file ``path``; yield whether we had to wait for it."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; run one process at a time there
        yield False
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            print(f"[pipeline] waiting for another process running {path.name[1:-5]!r} "
                  f"({path.parent}) ...")
            fcntl.flock(f, fcntl.LOCK_EX)
            waited = True
        try:
            yield waited
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- what a runs folder holds ------------------------------------------------------------------


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


def model_to_show(profile: Profile | str | None = None,
                  stages: tuple[str, ...] = ("dpo", "sft")) -> tuple[Path, str]:
    """The model a notebook shows, and a sentence saying which: the most trained finished stage
    among ``stages`` under ``runs/<profile>`` (the student's own), else ``REFERENCE_MODEL``.
    The smoke profile always shows the reference: its own models train for seconds and answer
    noise, and what the notebook shows (and checks) should not depend on which notebook ran
    first. Nothing is trained; ``ensure`` is the way to train.

    >>> folder, which = model_to_show("cpu", stages=("no-such-stage",))
    >>> folder == REFERENCE_MODEL, which.startswith("the shipped reference model")
    (True, True)
    >>> model_to_show("smoke")[0] == REFERENCE_MODEL
    True
    """
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    if profile.name == "smoke":
        return REFERENCE_MODEL, ("the shipped reference model (data/reference/sft: the cpu profile "
                                 "after SFT); the smoke profile's own models answer noise")
    for stage in stages:
        if read_marker(profile.runs_dir / stage) is not None:
            return (profile.runs_dir / stage,
                    f"your own {stage!r} model ({profile.name} profile, "
                    f"{profile.runs_dir / stage})")
    return REFERENCE_MODEL, ("the shipped reference model (data/reference/sft: the cpu profile "
                             "after SFT), since runs/" f"{profile.name}/ holds no finished "
                             f"{' or '.join(stages)} stage yet")


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_runs(root: Path) -> list[dict]:
    """Every stage folder and kept previous run under ``root``: name, status, run id, finish
    time, bytes on disk (what ``python -m minimind_lib runs`` prints)."""
    rows = []
    for name in STAGES:
        folder = root / name
        if folder.is_dir():
            rows.append(_run_row(name, folder, kept=False))
    previous = root / PREVIOUS_DIR
    if previous.is_dir():
        rows += [_run_row(p.name, p, kept=True) for p in sorted(previous.iterdir()) if p.is_dir()]
    return rows


def _run_row(name: str, folder: Path, kept: bool) -> dict:
    marker = read_marker(folder) or {}
    return {"name": name, "path": str(folder), "kept": kept,
            "status": "done" if marker else "unfinished", "run_id": marker.get("run_id"),
            "finished_at": marker.get("finished_at"), "bytes": folder_bytes(folder)}
