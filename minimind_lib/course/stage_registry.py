"""The stage registry (``course.stages`` registers the stages into it): what a stage function
gets (``StageContext``), what a registered stage is (``Stage``), ``register`` and the one list
of stages, ``STAGES``, in registration order. A finished stage's record is its ``stage.json``
(``read_marker``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from minimind_lib.core.checked_files import FileProblem, read_json
from minimind_lib.core.filenames import MARKER_FILE, TOKENIZER_FILE
from minimind_lib.course.profiles import Profile
from minimind_lib.tokenizer.bpe import BPETokenizer


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
    init: Path | None = None  # --init: the model folder to start from instead of the default

    def dir(self, stage: str) -> Path:
        """The output folder of ``stage`` (e.g. a prerequisite's)."""
        return self.root / stage

    def start_dir(self) -> Path:
        """The model this stage starts from: ``--init`` when given, else the output of the stage
        it ``starts_from`` (sft: pretrain, dpo: sft, ...)."""
        if self.init is not None:
            return self._same_tokenizer(self.init)
        default = get_stage(self.stage).starts_from
        if default is None:
            raise ValueError(f"stage {self.stage!r} does not start from a model")
        return self._same_tokenizer(self.dir(default))

    def _same_tokenizer(self, folder: Path) -> Path:
        """``folder``, once its model's tokenizer (when it ships one) is the run's: other ids
        would feed the model tokens it never learned."""
        theirs, ours = folder / TOKENIZER_FILE, self.dir("tokenizer") / TOKENIZER_FILE
        if theirs.is_file() and ours.is_file():
            a, b = BPETokenizer.from_file(theirs), BPETokenizer.from_file(ours)
            if a.vocab != b.vocab or a.merges != b.merges:
                raise ValueError(f"{folder}: its model was trained with another tokenizer than "
                                 f"this run's ({ours}); retrain it with this tokenizer (for the "
                                 "shipped reference: make reference) or start from this run's "
                                 "own stages")
        return folder

    @property
    def out_dir(self) -> Path:
        return self.dir(self.stage)

    def tokenizer(self) -> BPETokenizer:
        """The run's tokenizer (the ``tokenizer`` stage's copy)."""
        return BPETokenizer.from_file(self.dir("tokenizer") / TOKENIZER_FILE)


@dataclass(frozen=True)
class Stage:
    """A registered stage: what it needs, reads and makes. Every list of stages elsewhere (the
    CLI's commands, ``all``, the report, the plan, the fingerprints) is derived from these."""

    name: str
    run: Callable[[StageContext], dict]  # writes ctx.out_dir; returns a json-able summary
    requires: tuple[str, ...] = ()
    description: str = ""
    distributed: bool = False  # True: every torchrun rank runs it; False: rank 0 only
    sources: Callable[[Profile], list[Path]] | None = None  # files it reads (-> fingerprint)
    in_all: bool = True  # part of ``python -m minimind_lib all``
    serves: bool = False  # its folder is a chat model `serve` / `chat` may pick by default
    starts_from: str | None = None  # the stage whose model it starts from (``--init`` replaces)
    settings: str | None = None  # the Profile field holding its hyper-parameters
    evaluates: bool = False  # it scores models on profile.eval_per_task questions a task
    title: str = ""  # its section of report.md ("": none)
    curves: tuple[str, ...] | None = None  # metrics plotted beside loss and lr (None: no plot)
    validation: str = ""  # what its validation curve measures, one line (report.md says it)
    training: str = ""  # what its training loss curve averages, one line (report.md says it)

    def inputs(self, profile: Profile) -> list[Path]:
        """The files this stage reads besides its prerequisites' folders (an error naming the
        ``download`` command when training data is missing)."""
        return self.sources(profile) if self.sources is not None else []

    def settings_in(self, profile: Profile) -> object | None:
        """This stage's hyper-parameters in ``profile`` (None: it has none)."""
        return getattr(profile, self.settings) if self.settings is not None else None


STAGES: dict[str, Stage] = {}


def register(name: str, **fields: object):
    """Decorator adding a stage function to ``STAGES`` (and so to ``ensure``, the CLI, the
    report and the plan); ``fields`` are ``Stage``'s. ``starts_from`` (a stage in ``requires``)
    is the model it builds on, which ``--init`` can replace; ``settings`` names a field of
    ``Profile``."""
    def wrap(fn: Callable[[StageContext], dict]) -> Callable[[StageContext], dict]:
        stage = Stage(name, fn, **fields)
        missing = [r for r in stage.requires if r not in STAGES]
        if missing:
            raise ValueError(f"stage {name!r} requires {missing}, registered after it")
        if stage.starts_from is not None and stage.starts_from not in stage.requires:
            raise ValueError(f"stage {name!r} starts from {stage.starts_from!r}, not in its "
                             "requires")
        if stage.settings is not None and stage.settings not in Profile.__dataclass_fields__:
            raise ValueError(f"stage {name!r}: settings {stage.settings!r} is not a Profile field")
        STAGES[name] = stage
        return fn
    return wrap


def get_stage(name: str) -> Stage:
    """The registered stage ``name``; an unknown name is an error listing the stages."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return STAGES[name]


def read_marker(stage_dir: Path) -> dict | None:
    """The ``stage.json`` of a finished stage, or None. A damaged one (cut short by a full disk,
    edited) is an error naming it and saying how to go on."""
    path = Path(stage_dir) / MARKER_FILE
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except FileProblem as e:
        raise FileProblem(f"{e}; the stage's record is damaged: move or delete {stage_dir} "
                          "and run the stage again") from None
