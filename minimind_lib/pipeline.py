"""Stages of the course and ``ensure``: reuse a stage's output, or produce it (notebooks 04-08).

Each stage writes ``<root>/<stage>/`` (``root`` defaults to ``runs/<profile>``) and, last of
all, ``stage.json``: a summary plus a *fingerprint* of what the output was made from (the
profile's model and stage settings, the data files, the prerequisites' runs). ``ensure``
returns the folder when that marker exists and its fingerprint still matches; otherwise it
ensures the prerequisites and runs the stage (with a progress bar).

Stages: ``tokenizer`` (copies the course tokenizer, ``data/tokenizer/``) → ``pretrain`` →
``sft`` (``minimind_lib.sft``) → ``dpo`` (``minimind_lib.dpo``) → ``quantize``
(``minimind_lib.quantize``). A stage registers itself with the decorator and gets ``ensure`` and a CLI
subcommand (``python -m minimind_lib <stage>``) for free::

    @register("sft", requires=("pretrain",), description="supervised fine-tuning")
    def _sft(ctx: StageContext) -> dict:
        base = ctx.dir("pretrain")        # a load_model folder
        ...                               # train into ctx.out_dir; return a summary dict

>>> list(STAGES)[:2]
['tokenizer', 'pretrain']
>>> STAGES["pretrain"].requires
('tokenizer',)
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch.distributed as dist

from minimind_lib import DATA_DIR
from minimind_lib.checkpoint import atomic_write_text, save_model
from minimind_lib.data import dataset_files, load_pretrain_split, pretokenize
from minimind_lib.device import seed_everything
from minimind_lib.dpo import dpo_stage
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.profiles import Profile, get_profile
from minimind_lib.quantize import quantize_stage
from minimind_lib.sft import sft_stage
from minimind_lib.train import METRICS_FILE, TrainConfig, init_distributed, train

MARKER = "stage.json"
TOKENIZER_FILE = "tokenizer.json"
COURSE_TOKENIZER_DIR = DATA_DIR / "tokenizer"


@dataclass
class StageContext:
    """What a stage function gets: the profile, where to write and how to run."""

    stage: str
    profile: Profile
    root: Path  # <root>/<stage>/ for every stage
    resume: bool = False
    device: str | None = None
    precision: str = "auto"
    progress: bool = True
    callbacks: list[Callable[[dict], None]] = field(default_factory=list)

    def dir(self, stage: str) -> Path:
        """The output folder of ``stage`` (e.g. a prerequisite's)."""
        return self.root / stage

    @property
    def out_dir(self) -> Path:
        return self.dir(self.stage)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[StageContext], dict]  # writes ctx.out_dir; returns a json-able summary
    requires: tuple[str, ...] = ()
    description: str = ""
    distributed: bool = False  # True: every torchrun rank runs it; False: rank 0 only
    data_schema: str | None = None  # its data files enter the fingerprint


STAGES: dict[str, Stage] = {}


def register(name: str, *, requires: tuple[str, ...] = (), description: str = "",
             distributed: bool = False, data_schema: str | None = None):
    """Decorator adding a stage function to ``STAGES`` (and so to the CLI)."""
    def wrap(fn: Callable[[StageContext], dict]) -> Callable[[StageContext], dict]:
        STAGES[name] = Stage(name, fn, requires, description, distributed, data_schema)
        return fn
    return wrap


def _stage(name: str) -> Stage:
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return STAGES[name]


def read_marker(stage_dir: Path) -> dict | None:
    """The ``stage.json`` of a finished stage, or None."""
    path = stage_dir / MARKER
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def fingerprint(stage: str, profile: Profile, root: Path) -> dict:
    """What a stage's output depends on; a mismatch with ``stage.json`` means: run again."""
    st = _stage(stage)
    settings = getattr(profile, stage, None)
    files = dataset_files(st.data_schema) if st.data_schema else []
    return {
        "profile": profile.name, "seed": profile.seed, "model": profile.model.to_dict(),
        "settings": asdict(settings) if settings is not None else None,
        "data": [{"path": str(p), "bytes": p.stat().st_size} for p in files],
        "requires": {dep: (read_marker(root / dep) or {}).get("run_id") for dep in st.requires},
    }


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
    st = _stage(stage)
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
            (ctx.out_dir / MARKER).unlink(missing_ok=True)
        t0 = time.time()
        summary = st.run(ctx) if st.distributed or info.is_main else {}
        if info.is_main:
            marker = {"stage": stage, "run_id": uuid.uuid4().hex,
                      "seconds": round(time.time() - t0, 1), "summary": summary,
                      "fingerprint": fingerprint(stage, profile, root)}
            atomic_write_text(ctx.out_dir / MARKER, json.dumps(marker, indent=2) + "\n")
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


# --- the stages ------------------------------------------------------------------------


@register("tokenizer", description="copy the course tokenizer (data/tokenizer/) into the run")
def _tokenizer(ctx: StageContext) -> dict:
    source = COURSE_TOKENIZER_DIR / TOKENIZER_FILE
    if not source.is_file():
        raise FileNotFoundError(f"{source}: the course tokenizer is missing; rebuild data/ with "
                                "`make data` (scripts/build_data.py) or train one in notebook 01")
    for f in sorted(COURSE_TOKENIZER_DIR.iterdir()):
        if f.is_file():
            shutil.copyfile(f, ctx.out_dir / f.name)
    return {"source": str(COURSE_TOKENIZER_DIR)}


@register("pretrain", requires=("tokenizer",), distributed=True, data_schema="pretrain",
          description="pretrain the profile's model on the pretraining text")
def _pretrain(ctx: StageContext) -> dict:
    settings, info = ctx.profile.pretrain, init_distributed()
    data_dir = ctx.out_dir / "data"
    if info.is_main:  # one rank tokenises; the others wait, then read the same memmap
        pretokenize(dataset_files("pretrain"), ctx.dir("tokenizer") / TOKENIZER_FILE, data_dir,
                    max_examples=settings.max_examples, progress=ctx.progress)
    if info.world_size > 1:
        dist.barrier()
    meta = json.loads((data_dir / "meta.json").read_text())
    if meta["vocab_size"] > ctx.profile.model.vocab_size:
        raise ValueError(f"the tokenizer has {meta['vocab_size']} tokens but the profile's model "
                         f"vocab_size is {ctx.profile.model.vocab_size}")
    train_set = load_pretrain_split(data_dir, "train", settings.seq_len)
    has_val = meta["splits"]["val"]["tokens"] > settings.seq_len + 1
    val_set = load_pretrain_split(data_dir, "val", settings.seq_len) if has_val else None

    seed_everything(ctx.profile.seed)
    model = MiniMindForCausalLM(ctx.profile.model)
    config = TrainConfig.from_stage(settings, out_dir=ctx.out_dir, precision=ctx.precision,
                                    device=ctx.device, seed=ctx.profile.seed,
                                    progress=ctx.progress)
    rows = train(model, train_set, config, eval_dataset=val_set, resume=ctx.resume,
                 callbacks=ctx.callbacks)
    if info.is_main:
        save_model(model.cpu(), ctx.out_dir)
    last = rows[-1] if rows else {}
    return {"steps": config.max_steps, "final_loss": last.get("loss"),
            "final_val_loss": last.get("val_loss"), "tokens": last.get("tokens"),
            "metrics": METRICS_FILE, "train_windows": len(train_set),
            "val_windows": len(val_set) if val_set is not None else 0}


register("sft", requires=("pretrain",), distributed=True, data_schema="sft",
         description="supervised fine-tuning: ChatML, loss on the assistant's replies only; "
                     "evaluates before and after")(sft_stage)
register("dpo", requires=("sft",), data_schema="dpo",
         description="direct preference optimization of the SFT model against its frozen copy; "
                     "evaluates before and after")(dpo_stage)
register("quantize", requires=("dpo",),
         description="int8 weight-only quantisation of the DPO model; size, speed and quality "
                     "of fp32/fp16/bf16/int8")(quantize_stage)
