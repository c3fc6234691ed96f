"""Profiles: one switch (``$MINIMIND_PROFILE``) sizes the whole course.

* ``smoke``: CI and nbval. A tiny model; every notebook runs in about a minute on
  2 CPU cores and the losses still visibly fall.
* ``cpu``: a student without a GPU. A ~4.6M-parameter model; the whole course in
  about an hour on 2 CPU cores.
* ``gpu``: a student with a consumer GPU (8 GB is enough). MiniMind2-Small (25.8M) on the
  data present (the bundled sample, or ``$MINIMIND_DATA_DIR``): budgets in passes over that
  data (at most a few), capped so a big dataset still fits about half an hour on an RTX
  3060/4060 class card (``python -m minimind_lib plan --profile gpu`` shows the numbers).
* ``full``: MiniMind2-Small with MiniMind's "Zero" recipe on MiniMind's own datasets
  (``python -m minimind_lib download data``): one pass of pretraining text, two of SFT
  (pretrain_t2t_mini / sft_t2t_mini, or MiniMind2's pretrain_hq / sft_mini_512 where those are
  the files present), about 2 h on an RTX 3090 for MiniMind2's. It refuses to start without
  them.
* ``minimind3``: the same on MiniMind-3 (``preset("minimind-3")``, 63.9M) with its Zero
  recipe: one pass of pretrain_t2t_mini, one of sft_t2t_mini, 768-token sequences. The
  course's models speak MiniMind2's chat format, so SFT skips (and counts) the tool-use
  records; about 2.3 h on an RTX 3090 by MiniMind's own timing.
* ``auto`` (the default): ``gpu`` when CUDA is available, else ``cpu`` (also on Apple MPS:
  MPS trains in fp32, where the 4.6M model fits the hour; ``--profile gpu`` opts in).

Notebook cells read sizes from the profile; they never hard-code them. Any field can be
overridden: ``override(profile, {"pretrain.max_steps": "3"})`` (the CLI's ``--set`` and
``--config FILE.toml``).

>>> get_profile("smoke").model.hidden_size
64
>>> get_profile("tiny")
Traceback (most recent call last):
...
ValueError: unknown profile 'tiny'; valid profiles: smoke, cpu, gpu, full, minimind3, auto
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from types import UnionType
from typing import Union, get_args, get_origin, get_type_hints

import torch

from minimind_lib import REPO_ROOT
from minimind_lib.core.checked_files import read_toml
from minimind_lib.core.device import check_seed
from minimind_lib.core.download import DOWNLOAD_DIR
from minimind_lib.model.config import MiniMindConfig
from minimind_lib.model.presets import preset
from minimind_lib.training.agent_rl import AgentSettings
from minimind_lib.training.distill import DistillSettings
from minimind_lib.training.dpo import DPOSettings
from minimind_lib.training.grpo import GRPOSettings
from minimind_lib.training.lora import LoRASettings
from minimind_lib.training.ppo import PPOSettings
from minimind_lib.training.settings import RunOptions, TrainSettings
from minimind_lib.training.sft import SFTSettings
from minimind_lib.vision.clip import CLIPConfig
from minimind_lib.vision.recipe import VisionSettings, vision_training

PROFILE_NAMES = ("smoke", "cpu", "gpu", "full", "minimind3", "auto")
#: held-out questions a task: far more than any bundled task has (each has at most a few hundred)
MAX_EVAL_PER_TASK = 10**6
ENV_VAR = "MINIMIND_PROFILE"
DATA_ENV_VAR = "MINIMIND_DATA_DIR"
SEED_ENV_VAR = "MINIMIND_SEED"


@dataclass(frozen=True)
class Profile:
    """Everything that differs between CI, a laptop and a GPU: the model, the hyper-parameters
    of each training stage (``training.settings.TrainSettings``; DPO's and GRPO's add their own,
    LoRA's the adapter's shape), how the engine runs (``training.settings.RunOptions``) and which
    data it needs.

    ``needs_minimind_data``: the profile trains on MiniMind's datasets (``$MINIMIND_DATA_DIR``,
    else ``data/minimind/`` where ``download data`` puts them); otherwise on the data present
    (``$MINIMIND_DATA_DIR`` when set, else the bundled sample).
    """

    name: str
    description: str
    model: MiniMindConfig
    pretrain: TrainSettings
    sft: SFTSettings
    dpo: DPOSettings
    lora: LoRASettings
    eval_per_task: int  # held-out questions per task type used by evaluations
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    ppo: PPOSettings = field(default_factory=PPOSettings)  # GRPO's sibling with a critic
    distill: DistillSettings = field(default_factory=DistillSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)  # agentic RL (notebook 15)
    seed: int = 42
    vision: VisionSettings = field(default_factory=VisionSettings)  # the vision stage (notebook 13)
    train: RunOptions = field(default_factory=RunOptions)
    needs_minimind_data: bool = False
    overrides: tuple[str, ...] = ()  # the --set / --config values applied (``override``)

    def __post_init__(self) -> None:
        check_seed(self.seed, f"profile {self.name}: seed")
        if not 1 <= self.eval_per_task <= MAX_EVAL_PER_TASK:
            raise ValueError(f"profile {self.name}: eval_per_task must be in [1, "
                             f"{MAX_EVAL_PER_TASK:,}], got {self.eval_per_task}")

    @property
    def runs_dir(self) -> Path:
        """Where stages write their outputs: ``runs/<profile>`` (or
        ``$MINIMIND_RUNS_DIR/<profile>``)."""
        root = os.environ.get("MINIMIND_RUNS_DIR")
        return (Path(root) if root else REPO_ROOT / "runs") / self.name

    @property
    def data_dir(self) -> Path | None:
        """The folder holding MiniMind-format data for this profile (None: the bundled sample)."""
        external = os.environ.get(DATA_ENV_VAR)
        if external:
            return Path(external)
        return DOWNLOAD_DIR if self.needs_minimind_data else None


def _smoke() -> Profile:
    return Profile(
        name="smoke",
        description="CI / nbval: tiny model, each notebook ~1 min on 2 CPU cores",
        model=MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=2048),
        pretrain=TrainSettings(batch_size=8, seq_len=128, learning_rate=3e-3, max_steps=80,
                               warmup_steps=5, eval_every=20, save_every=40, max_examples=3000),
        sft=SFTSettings(batch_size=16, seq_len=128, learning_rate=5e-3, max_steps=80,
                          warmup_steps=5, eval_every=20, save_every=40, max_examples=4000),
        # notebook 06 aligns the shipped cpu-profile model (data/reference/sft) in this profile
        # too, as 09 and 10 do: the tiny smoke SFT model is never right, so its on-policy pairs
        # teach nothing. Measured from it, 120 steps of 8 pairs: lr 3e-4 with the cpu profile's
        # NLL and replay terms took the held-out on-policy loss 4.73 -> 4.60 and the skill pairs'
        # held-out preference accuracy 89.2% -> 91.7% at text perplexity 1.04x (lr 1e-3 without
        # them: skill exact-match 29.2% -> 14.2%, perplexity 5.1x; lr 1e-4: nothing moved)
        dpo=DPOSettings(batch_size=8, seq_len=128, learning_rate=3e-4, max_steps=120,
                        warmup_steps=5, eval_every=40, save_every=120, max_examples=1000,
                        questions=512, val_questions=32, nll_weight=2.0, replay_weight=1.0,
                        tasks="larger_number,arithmetic,first_word,extract_title"),
        lora=LoRASettings(batch_size=16, seq_len=96, learning_rate=5e-3, max_steps=40,
                          warmup_steps=5, weight_decay=0.0, eval_every=10, save_every=40,
                          max_examples=2000, replay=0.5),
        eval_per_task=20,
        # GRPO needs a model that is sometimes right: notebook 10 starts it from the shipped
        # cpu-profile model (data/reference/sft) in this profile too. Measured from it, 30 steps
        # of 8 questions x 8 answers: larger_number alone at lr 3e-4 lifted the mean reward
        # 0.66 -> 0.76 (first -> last third); three tasks at 3e-4 stayed flat (0.50 -> 0.49)
        grpo=GRPOSettings(batch_size=8, seq_len=128, learning_rate=3e-4, max_steps=30,
                          warmup_steps=2, eval_every=5, save_every=30, tasks="larger_number"),
        # PPO with a critic on GRPO's budget (8 questions x 8 answers a step, 30 steps)
        ppo=PPOSettings(batch_size=8, seq_len=128, learning_rate=3e-4, max_steps=30,
                        warmup_steps=2, eval_every=5, save_every=30, tasks="larger_number"),
        distill=DistillSettings(batch_size=8, seq_len=256, learning_rate=2e-3, max_steps=30,
                                warmup_steps=3, eval_every=10, eval_batches=5, save_every=30,
                                max_examples=800),
        # agentic RL (notebook 15) starts from the shipped model too (the smoke sft model calls
        # no tool): 3 steps of 4 tasks x 4 episodes show the machinery, not a gain
        agent=AgentSettings(batch_size=4, group_size=4, seq_len=768, learning_rate=1e-4,
                            max_steps=3, warmup_steps=1, eval_every=3, save_every=3),
        # vision (notebook 13): the smallest run that reads the picture. The smoke sft model
        # never does (150 VLM steps at lr 3e-3: VQA 32%, chance 35.7%); notebook 13 and
        # `vision --init data/reference/sft` put the shipped chat model under it. 16-pixel
        # patches (one per cell of the board: 16 picture tokens with merge 1, the encoder 4x
        # cheaper than at 8) and 500 VLM steps: on ideal features the VLM needs ~500 steps to
        # learn both count and side (scripts/vision_oracle.py), and with the picture token 250
        # steps scored 67-70%. Measured (50 held-out pictures, seeds 42 and 0-4,
        # docs/benchmarks.md): zero-shot 72-88% (chance 5%), VQA 76.0-82.6% (twice chance:
        # 71.3%), ~4.5 min of one thread. 250 VLM steps on 8-pixel patches (before): 50.5-57.0%
        vision=VisionSettings(
            train_images=2000, eval_images=50, clip=CLIPConfig(patch_size=16), merge=1,
            clip_training=vision_training(128, 2e-3, 400, seq_len=32, warmup_steps=10),
            vlm_training=vision_training(16, 1e-3, 500, seq_len=64, warmup_steps=10)),
    )


def _cpu() -> Profile:
    return Profile(
        name="cpu",
        description="laptop CPU: ~4.6M-param model, whole course ~1 h on 2 cores",
        model=MiniMindConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=2, max_position_embeddings=4096),
        # 1,200 steps x 4,096 tokens ~ 4.9M tokens ~ 5 passes over the bundled ~1M-token
        # sample: past that, validation loss flattens and the minutes are worth more in SFT.
        pretrain=TrainSettings(batch_size=16, seq_len=256, learning_rate=2e-3, max_steps=1200,
                               warmup_steps=50, eval_every=100, save_every=400),
        # replay (benchmarks/forgetting_sweep.py, docs/benchmarks.md): half the supervised
        # tokens pretraining text in 64-token windows, 2,500 steps in the 2,000-step run's wall
        # time: held-out text perplexity 2.3x the pretrained model's instead of 25x, skill
        # exact-match 36.5% (36.8% without replay)
        # seq_len 768 and group_by_length: the tool-use conversations (data/sft_tools.jsonl,
        # 440-750 tokens, ~1/7 of the records) fit whole, and pad only one another
        sft=SFTSettings(batch_size=16, seq_len=768, learning_rate=1e-3, max_steps=2500,
                        warmup_steps=50, eval_every=200, save_every=400, replay=0.5,
                        replay_window=64, group_by_length=True),
        # measured from data/reference/sft (benchmarks/forgetting_sweep.py --stage dpo,
        # docs/benchmarks.md): held-out skill exact-match 36.5% -> 40.0% with or without
        # replay; replaying a 64-token window of pretraining text beside every pair (weight 1)
        # keeps text perplexity at 0.83x the SFT model's instead of 2.77x, every task's format
        # >= 99% instead of 92%, and the held-out on-policy loss falling (3.03 -> 2.38; without
        # replay it rises 3.15 -> 3.41 after step 150); 9.8 min instead of 7.2
        dpo=DPOSettings(batch_size=16, seq_len=256, learning_rate=3e-4, max_steps=400,
                        warmup_steps=20, eval_every=50, save_every=200, questions=2000,
                        tasks="larger_number,arithmetic,first_word,extract_title",
                        nll_weight=2.0, replay_weight=1.0),
        # measured (benchmarks/lora_bench.py, docs/benchmarks.md): at 300 steps LoRA had
        # learnt one direction of the new task (digits_to_hanzi 3-37%), at 600 both; without
        # replay both arms forgot the SFT skills (exact-match 34% -> 0%), with half the
        # conversations replayed LoRA kept them. 96 tokens fit every bundled conversation.
        lora=LoRASettings(batch_size=16, seq_len=96, learning_rate=5e-3, max_steps=600,
                          warmup_steps=20, weight_decay=0.0, eval_every=100, save_every=600,
                          replay=0.5),
        eval_per_task=100,
        # measured from data/reference/sft (3 tasks, 200 steps): lr 1e-4 +2.6 points of held-out
        # skill exact-match; 2e-4 +0.0 (format fell to 93%); 1e-4 with 2 updates per batch +0.3
        grpo=GRPOSettings(batch_size=16, seq_len=256, learning_rate=1e-4, max_steps=200,
                          warmup_steps=5, eval_every=25, save_every=100),
        # PPO with a critic on GRPO's budget (16 questions x 8 answers, 200 steps, 3 tasks)
        ppo=PPOSettings(batch_size=16, seq_len=256, learning_rate=1e-4, max_steps=200,
                        warmup_steps=5, eval_every=25, save_every=100),
        # a student a quarter the teacher's width (1.6M parameters against 4.5M): the KD and
        # baseline arms at equal steps are scripts/distill_probe.py's (docs/benchmarks.md)
        distill=DistillSettings(batch_size=16, seq_len=256, learning_rate=2e-3, max_steps=600,
                                warmup_steps=20, eval_every=100, save_every=600,
                                max_examples=4800),
        # agentic RL from data/reference/sft: 8 tasks x 8 episodes a step, 20 steps (~15 min
        # of the 2-core machine; measured in docs/benchmarks.md)
        agent=AgentSettings(batch_size=8, group_size=8, seq_len=768, learning_rate=1e-4,
                            max_steps=20, warmup_steps=2, eval_every=10, save_every=20),
        # measured (scripts/measure_vision.py, docs/benchmarks.md): zero-shot 66.0%, VQA 81.8%
        # on held-out pairs (400 VLM steps, no position vectors or recolouring: 69.0%, 66.5%),
        # 9.9 min on 1 thread
        vision=VisionSettings(
            train_images=20000, eval_images=100,
            clip_training=vision_training(128, 2e-3, 800, seq_len=32),
            vlm_training=vision_training(16, 1e-3, 800, seq_len=64)),
    )


# the gpu and full profiles' tiny CLIP: twice as wide, twice as deep an image encoder
_GPU_CLIP = CLIPConfig(vision_width=128, vision_layers=4, text_width=128, embed_dim=128)
_GPU_VISION = VisionSettings(train_images=50000, eval_images=200, clip=_GPU_CLIP,
                             clip_training=vision_training(256, 2e-3, 3000, seq_len=32),
                             vlm_training=vision_training(32, 1e-3, 1500, seq_len=64))
# The cpu profile's LoRA run (measured there) on a twice as large batch of up to 512 tokens
# (MiniMind's SFT conversations are longer), at half its learning rate as the gpu SFT's is
# half the cpu's: not measured on a GPU.
_GPU_LORA = LoRASettings(batch_size=32, seq_len=512, learning_rate=2.5e-3, max_steps=600,
                         warmup_steps=20, weight_decay=0.0, eval_every=100, save_every=600,
                         replay=0.5)


def _gpu() -> Profile:
    # Budgets in passes over the data present, each capped by max_steps so that a big dataset
    # still fits: on an RTX 3060/4060 (about 25-30 dense bf16 TFLOP/s) at the 25% MFU that
    # plan.py assumes, 3,800 steps x 8,192 tokens of pretraining is about 15 minutes. The
    # bundled ~1M-token sample takes 4 passes (~500 steps), a few minutes on such a card.
    return Profile(
        name="gpu",
        description="consumer GPU: MiniMind2-Small (25.8M params) on the data present",
        model=MiniMindConfig(),
        pretrain=TrainSettings(batch_size=16, seq_len=512, learning_rate=1e-3, epochs=4,
                               max_steps=3800, warmup_steps=50, eval_every=100,
                               save_every=500),
        # SFT and DPO replay pretraining text as the cpu profile measured it (not yet measured
        # on a GPU)
        sft=SFTSettings(batch_size=32, seq_len=512, learning_rate=5e-4, epochs=3,
                        max_steps=2000, warmup_steps=50, eval_every=200, save_every=500,
                        replay=0.5, replay_window=64),
        dpo=DPOSettings(batch_size=16, seq_len=512, learning_rate=1e-4, epochs=2,
                        max_steps=1000, warmup_steps=20, eval_every=100, save_every=500,
                        questions=4000, tasks="larger_number,arithmetic,first_word,extract_title",
                        nll_weight=1.0, replay_weight=1.0),
        lora=_GPU_LORA,
        eval_per_task=100,
        grpo=GRPOSettings(batch_size=16, seq_len=512, learning_rate=1e-4, max_steps=400,
                          warmup_steps=10, eval_every=40, save_every=200),
        vision=_GPU_VISION,
    )


def _full() -> Profile:
    # MiniMind's "Zero" recipe for MiniMind2-Small: pretrain one pass (lr 5e-4, batch
    # 32 x 512, accumulation 8), SFT two passes of sft_mini_512 at batch 16 (lr 5e-7 .. 5e-6
    # in the original; we use 5e-5 with cosine decay since our loop decays to 10%), then DPO
    # on a 16,000-pair sample of dpo.jsonl at lr 1e-6.
    return Profile(
        name="full",
        description="GPU + MiniMind's datasets: MiniMind2-Small (25.8M), MiniMind's Zero recipe",
        model=MiniMindConfig(),
        pretrain=TrainSettings(batch_size=32, seq_len=512, learning_rate=5e-4, epochs=1,
                               max_steps=None, accumulation_steps=8, warmup_steps=100,
                               eval_every=250, save_every=500),
        sft=SFTSettings(batch_size=16, seq_len=512, learning_rate=5e-5, epochs=2,
                          max_steps=None, warmup_steps=100, eval_every=500, save_every=1000),
        # MiniMind's SFT data has no checkable answers: DPO on its preference pairs (offline)
        dpo=DPOSettings(batch_size=16, seq_len=512, learning_rate=1e-6, max_steps=1000,
                        warmup_steps=50, eval_every=100, save_every=500, pairs="offline"),
        lora=_GPU_LORA,
        eval_per_task=200,
        vision=_GPU_VISION,
        needs_minimind_data=True,
    )


def _minimind3() -> Profile:
    # MiniMind-3's "Zero" recipe (trainer/train_pretrain.py, train_full_sft.py and its README,
    # April 2026): one pass of pretrain_t2t_mini (lr 5e-4, batch 32 x accumulation 8), one of
    # sft_t2t_mini (lr 1e-5, batch 16), sequences of 768 tokens as its dataset notes advise;
    # MiniMind times the two at about 2.3 h on one RTX 3090.
    full = _full()
    return replace(
        full, name="minimind3",
        description="GPU + MiniMind's current quick files: MiniMind-3 (63.9M), its Zero recipe",
        model=preset("minimind-3"),
        pretrain=replace(full.pretrain, seq_len=768),
        sft=replace(full.sft, seq_len=768, learning_rate=1e-5, epochs=1),
        dpo=replace(full.dpo, seq_len=768),
    )


_BUILDERS = {"smoke": _smoke, "cpu": _cpu, "gpu": _gpu, "full": _full, "minimind3": _minimind3}


def resolve_profile_name(name: str | None = None) -> str:
    """``name`` → ``$MINIMIND_PROFILE`` → "auto"; "auto" becomes "gpu" with CUDA, else "cpu"."""
    chosen = (name or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if chosen not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {chosen!r}; valid profiles: {', '.join(PROFILE_NAMES)}")
    if chosen == "auto":
        chosen = "gpu" if torch.cuda.is_available() else "cpu"
    return chosen


def get_profile(name: str | None = None, **overrides) -> Profile:
    """The ``Profile`` called ``name`` (default: ``$MINIMIND_PROFILE``, else "auto").

    Keyword ``overrides`` replace top-level fields (``get_profile("smoke", seed=1)``);
    ``$MINIMIND_SEED`` sets the seed of every stage and notebook run (``--set seed=N`` for one
    run), so a figure can be checked over several seeds (``benchmarks/quoted_spread.py``).
    """
    profile = _BUILDERS[resolve_profile_name(name)]()
    seed = os.environ.get(SEED_ENV_VAR, "").strip()
    if seed:
        try:
            profile = override(profile, {"seed": seed})
        except ValueError as err:
            raise ValueError(f"${SEED_ENV_VAR}: {err}") from None
    return replace(profile, **overrides) if overrides else profile



# --- overrides: --set section.field=value and --config FILE.toml ---------------------------

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_NONE = ("none", "null")
_TOP_LEVEL = ("seed", "eval_per_task")


def _sections(profile: Profile) -> dict[str, object]:
    """What ``override`` can change: every settings section of the profile (the model, each
    stage's hyper-parameters, the run options), and the settings nested in those
    (``vision.clip``), by dotted name."""
    out = {f.name: getattr(profile, f.name) for f in fields(profile)
           if is_dataclass(getattr(profile, f.name))}
    for name, obj in list(out.items()):
        out.update({f"{name}.{f.name}": getattr(obj, f.name) for f in fields(obj)
                    if is_dataclass(getattr(obj, f.name))})
    return out


def _settable(obj: object) -> list[str]:
    """The fields of a settings section that hold values (not nested settings)."""
    return [f.name for f in fields(obj) if not is_dataclass(getattr(obj, f.name))]


def valid_keys(profile: Profile) -> list[str]:
    """Every key ``override`` accepts, e.g. ``pretrain.max_steps``, ``vision.clip.embed_dim``."""
    keys = [f"{name}.{f}" for name, obj in _sections(profile).items() for f in _settable(obj)]
    return keys + list(_TOP_LEVEL)


def _coerce(value: object, hint: object, key: str) -> object:
    """``value`` (a string from --set, or a TOML value) as the type ``hint`` describes."""
    options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    if isinstance(value, str) and value.strip().lower() in _NONE and type(None) in options:
        return None
    errors = []
    for option in (o for o in options if o is not type(None)):
        try:
            return _as(value, option)
        except (TypeError, ValueError) as e:
            errors.append(str(e))
    raise ValueError(f"{key}: cannot use {value!r} ({'; '.join(errors)})")


def _as(value: object, kind: object) -> object:
    if get_origin(kind) is tuple:
        parts = value.split(",") if isinstance(value, str) else list(value)
        args = get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[str, ...]: any number of values
            return tuple(_as(p.strip() if isinstance(p, str) else p, args[0]) for p in parts)
        if len(parts) != len(args):
            raise ValueError(f"expected {len(args)} comma-separated values")
        return tuple(_as(p, a) for p, a in zip(parts, args, strict=True))
    if get_origin(kind) is dict or kind is dict:
        parsed = json.loads(value) if isinstance(value, str) else value
        if not isinstance(parsed, dict):
            raise ValueError("expected a JSON object")
        return parsed
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError("expected true or false")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("expected an integer")
        try:
            return int(value)
        except ValueError:
            raise ValueError("expected an integer") from None
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError("expected a number")
        try:
            number = float(value)
        except ValueError:
            raise ValueError("expected a number") from None
        if not math.isfinite(number):
            raise ValueError("expected a finite number")
        return number
    if kind is str:
        return str(value)
    raise ValueError(f"unsupported type {kind}")


def _expand(values: Mapping[str, object],
            sections: Mapping[str, object]) -> list[tuple[str, object]]:
    """``values`` with each table given for a nested section (TOML's ``[vision.clip]``
    arrives as ``{"vision.clip": {"embed_dim": 16}}``) spread into its dotted keys."""
    out: list[tuple[str, object]] = []
    for key, value in values.items():
        if key in sections and isinstance(value, Mapping):
            out += _expand({f"{key}.{k}": v for k, v in value.items()}, sections)
        else:
            out.append((key, value))
    return out


def override(profile: Profile, values: Mapping[str, object]) -> Profile:
    """``profile`` with ``values`` applied: keys ``section.field`` (``valid_keys``), values
    strings (parsed by the field's type: ``3``, ``2e-3``, ``true``, ``none``, ``0.9,0.95``)
    or typed TOML values. An unknown key is an error listing the valid ones; a value out of
    range is the dataclass's own error. Changing ``model.hidden_size`` re-derives
    ``intermediate_size`` unless that is set too.

    >>> p = override(get_profile("smoke"), {"pretrain.max_steps": "3", "train.compile": "true"})
    >>> p.pretrain.max_steps, p.train.compile, p.overrides
    (3, True, ('pretrain.max_steps=3', 'train.compile=true'))
    >>> override(p, {"pretrain.max_step": "3"})
    Traceback (most recent call last):
    ...
    ValueError: unknown setting 'pretrain.max_step'; valid pretrain keys: batch_size, seq_len, ...
    """
    sections = _sections(profile)
    changes: dict[str, dict[str, object]] = {}
    top: dict[str, object] = {}
    expanded = _expand(values, sections)
    for key, value in expanded:
        section, _, name = key.rpartition(".")
        if not section and key in _TOP_LEVEL:
            top[key] = _coerce(value, int, key)
            continue
        if section not in sections:
            tops = dict.fromkeys(k.partition(".")[0] for k in sections)
            raise ValueError(f"unknown setting {key!r}; sections: {', '.join(tops)}, and "
                             f"the top-level keys {', '.join(_TOP_LEVEL)}")
        obj = sections[section]
        names = _settable(obj)
        if name not in names:
            raise ValueError(f"unknown setting {key!r}; valid {section} keys: {', '.join(names)}")
        hints = get_type_hints(type(obj))
        changes.setdefault(section, {})[name] = _coerce(value, hints[name], key)
    # deepest sections first: "vision.clip" is rebuilt, then put into "vision"
    while changes:
        section = max(changes, key=lambda k: k.count("."))
        obj, new = sections[section], changes.pop(section)
        if section == "model" and "hidden_size" in new and "intermediate_size" not in new:
            new["intermediate_size"] = None  # derived again from the new width
        if (section == "model" and {"hidden_size", "num_attention_heads"} & set(new)
                and "head_dim" not in new and obj.head_dim * obj.num_attention_heads
                == obj.hidden_size):
            new["head_dim"] = None  # it was the quotient: it is again
        try:
            sections[section] = replace(obj, **new)
        except (TypeError, ValueError) as e:
            raise ValueError(f"--set {section}.*: {e}") from None
        parent, _, name = section.rpartition(".")
        if parent:
            changes.setdefault(parent, {})[name] = sections[section]
    record = tuple(f"{k}={v}" for k, v in expanded)
    return replace(profile, **{k: v for k, v in sections.items() if "." not in k}, **top,
                   overrides=profile.overrides + record)


def load_config(path: str | os.PathLike) -> dict[str, object]:
    """A TOML file of overrides as ``override`` keys: ``[pretrain] max_steps = 3`` becomes
    ``{"pretrain.max_steps": 3}``; top-level ``seed = 1`` stays ``{"seed": 1}``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such config file")
    data = read_toml(path)
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):  # [vision.clip] stays a table: override expands it
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def parse_set(items: Sequence[str]) -> dict[str, str]:
    """``["pretrain.max_steps=3", ...]`` (the CLI's repeated ``--set``) as a dict.

    >>> parse_set(["sft.learning_rate=1e-4", "seed=7"])
    {'sft.learning_rate': '1e-4', 'seed': '7'}
    """
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. pretrain.max_steps=3")
        out[key.strip()] = value.strip()
    return out
