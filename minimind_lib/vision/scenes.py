"""Synthetic pictures with exact answers: coloured shapes, their captions and questions
(notebook 13).

A *scene* is a few identical shapes on a light background. Five attributes describe it, and
every caption and answer follows from them:

* ``colour`` (red, green, blue, yellow, purple), ``shape`` (circle, square, triangle, cross),
* ``count`` (1-3), ``size`` (small, big), ``side`` (all shapes in the left or the right half).

``render`` draws a scene with numpy, pixel by pixel (no font, no download), so an image is a
pure function of its scene, and a scene a pure function of ``(seed, split, index)``
(``make_scene``): any image can be rebuilt from three numbers.

**The split is by combination.** ``HELD_OUT_PAIRS`` are five (colour, shape) pairs that never
appear in training: one per colour, every shape at least once. Training shows each colour with
three shapes and each shape with three or four colours; held-out images show a colour and a
shape that training never put together (a red circle when training only had red squares,
red triangles, red crosses and green/blue/yellow circles). Answering about them needs the
attributes to be understood separately, not memorised as pairs.

Each scene has captions in English and Chinese (``caption``) and ten questions
(``questions``: five kinds in two languages) with one exact answer each ("What colour are the
shapes?" -> "red"; "图中有几个图形？" -> "2").

>>> scene = make_scene(seed=0, split="train", index=0)
>>> scene.attributes()
('purple', 'square', 2, 'big', 'left')
>>> caption(scene, "en"), caption(scene, "zh")
('two big purple squares on the left', '左边有两个大的紫色正方形')
>>> render(scene).shape, render(scene).dtype
((64, 64, 3), dtype('uint8'))
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass

import numpy as np

COLOURS = {"red": (220, 40, 40), "green": (30, 170, 60), "blue": (40, 80, 230),
           "yellow": (235, 200, 0), "purple": (150, 50, 200)}
SHAPES = ("circle", "square", "triangle", "cross")
#: shapes no caption or answer names: a "reshaped" scene shows a palette colour in one of them
UNNAMED_SHAPES = ("ring", "diamond")
COUNTS = (1, 2, 3)
SIZES = ("small", "big")
SIDES = ("left", "right")
BACKGROUND = (240, 240, 240)
IMAGE_SIZE = 64  # pixels per side
GRID = 4  # the image is a GRID x GRID board of cells; a side is GRID // 2 columns of it
RADIUS = {"small": 4.0, "big": 6.5}  # pixels; a cell is IMAGE_SIZE / GRID = 16 pixels wide
#: (colour, shape) pairs kept out of training: a diagonal, so each colour loses one shape
HELD_OUT_PAIRS = tuple((c, SHAPES[i % len(SHAPES)]) for i, c in enumerate(COLOURS))
#: seen: new images of the training pairs; recoloured: training scenes in unnamed colours;
#: reshaped: palette colours in unnamed shapes
SPLITS = ("train", "held_out", "seen", "recoloured", "reshaped")
#: a recoloured scene's hue keeps this many degrees from every palette colour's hue (or it is
#: a grey): no picture of that split shows a colour a person would call one of the five
HUE_MARGIN = 30.0

ZH = {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色", "purple": "紫色",
      "circle": "圆形", "square": "正方形", "triangle": "三角形", "cross": "十字形",
      "small": "小", "big": "大", "left": "左边", "right": "右边", "shape": "图形"}
EN_COUNT = {1: "one", 2: "two", 3: "three"}
ZH_COUNT = {1: "一", 2: "两", 3: "三"}
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses",
          "shape": "shapes"}
#: the question kinds, each with its possible answers (so chance = 1 / len(answers))
QUESTION_KINDS = ("colour", "shape", "count", "size", "side")
LANGUAGES = ("en", "zh")


@dataclass(frozen=True)
class Scene:
    """One picture's content: the five attributes and where each shape sits.

    ``cells`` are (row, column) cells of the ``GRID`` x ``GRID`` board, ``offsets`` each
    shape's shift from its cell's centre in pixels (a little jitter, so no two images of the
    same attributes are the same picture).
    """

    colour: str
    shape: str
    count: int
    size: str
    side: str
    cells: tuple[tuple[int, int], ...]
    offsets: tuple[tuple[float, float], ...]
    rgb: tuple[int, int, int] | None = None  # the ink of a recoloured scene (colour is "")

    def attributes(self) -> tuple[str, str, int, str, str]:
        return self.colour, self.shape, self.count, self.size, self.side

    @property
    def pair(self) -> tuple[str, str]:
        """The (colour, shape) combination the split is made by."""
        return self.colour, self.shape


def pairs(split: str) -> list[tuple[str, str]]:
    """The (colour, shape) pairs images of ``split`` show: the held-out ones, or the rest.

    >>> len(pairs("train")), len(pairs("held_out")), pairs("held_out")[0]
    (15, 5, ('red', 'circle'))
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    every = [(c, s) for c in COLOURS for s in SHAPES]
    held_out = set(HELD_OUT_PAIRS)
    if split == "recoloured":
        return [("", shape) for shape in SHAPES]
    if split == "reshaped":
        return [(colour, shape) for colour in COLOURS for shape in UNNAMED_SHAPES]
    return [p for p in every if (p in held_out) == (split == "held_out")]


def hue(rgb: tuple[int, int, int]) -> float:
    """The hue of an RGB colour in degrees (0 red, 120 green, 240 blue)."""
    r, g, b = (v / 255 for v in rgb)
    hi, lo = max(r, g, b), min(r, g, b)
    if hi == lo:
        return 0.0
    if hi == r:
        h = (g - b) / (hi - lo) % 6
    elif hi == g:
        h = (b - r) / (hi - lo) + 2
    else:
        h = (r - g) / (hi - lo) + 4
    return 60.0 * h


def hue_distance(rgb: tuple[int, int, int], colour: str) -> float:
    """Degrees around the colour wheel between ``rgb``'s hue and palette ``colour``'s."""
    d = abs(hue(rgb) - hue(COLOURS[colour]))
    return min(d, 360 - d)


def is_grey(rgb: tuple[int, int, int]) -> bool:
    """Too little saturation to have a hue."""
    return max(rgb) - min(rgb) < 0.2 * 255


def is_unnamed(rgb: tuple[int, int, int], shape: str | None = None) -> bool:
    """True for a grey, or a colour whose hue is ``HUE_MARGIN`` degrees from every palette
    colour's: one that no caption's colour word would fit. With ``shape``, also False when
    the palette colour nearest in hue is one ``HELD_OUT_PAIRS`` keeps away from that shape,
    so that a recoloured circle is never even reddish.

    >>> is_unnamed((128, 128, 128)), is_unnamed((200, 60, 60)), is_unnamed((40, 200, 200))
    (True, False, True)
    """
    if is_grey(rgb):
        return True
    distances = {c: hue_distance(rgb, c) for c in COLOURS}
    nearest = min(distances, key=distances.get)
    if distances[nearest] < HUE_MARGIN:
        return False
    return shape is None or (nearest, shape) not in HELD_OUT_PAIRS


def unnamed_colour(rng: np.random.Generator, shape: str) -> tuple[int, int, int]:
    """A random ink for a recoloured ``shape``, darker than the background: a grey one time
    in four, else a saturated colour whose hue is redrawn until ``is_unnamed`` (lime, teal,
    cyan, pink or magenta: the gaps the five palette hues leave)."""
    if rng.random() < 0.25:
        return (int(rng.integers(0, 181)),) * 3
    s, v = rng.uniform(0.6, 1.0), rng.uniform(0.35, 0.78)
    while True:
        rgb = tuple(int(round(255 * x)) for x in colorsys.hsv_to_rgb(rng.random(), s, v))
        if is_unnamed(rgb, shape):
            return rgb


def make_scene(seed: int, split: str, index: int) -> Scene:
    """Scene ``index`` of ``split``: attributes drawn uniformly (the pair among the split's
    pairs), then ``count`` distinct cells on that side and a jitter for each.

    The random stream is ``numpy.random.default_rng([seed, split number, index])``, so scene
    ``i`` does not depend on any other scene ("seen" and "train" share pairs, not images).
    """
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    rng = np.random.default_rng([seed, SPLITS.index(split) if split in SPLITS else -1, index])
    choices = pairs(split)
    colour, shape = choices[rng.integers(len(choices))]
    rgb = unnamed_colour(rng, shape) if split == "recoloured" else None
    count = COUNTS[rng.integers(len(COUNTS))]
    size, side = SIZES[rng.integers(2)], SIDES[rng.integers(2)]
    half = GRID // 2
    columns = range(half) if side == "left" else range(half, GRID)
    board = [(r, c) for r in range(GRID) for c in columns]
    picked = rng.choice(len(board), size=count, replace=False)
    cells = tuple(sorted(board[k] for k in picked))
    room = IMAGE_SIZE / GRID / 2 - RADIUS[size] - 0.5  # keep every shape inside its cell
    offsets = tuple((float(dx), float(dy)) for dx, dy in rng.uniform(-room, room, (count, 2)))
    return Scene(colour, shape, count, size, side, cells, offsets, rgb)


def check_shares(recoloured: float, reshaped: float = 0.0) -> tuple[float, float]:
    """The shares of recoloured and of reshaped training pictures if each is in [0, 1) and
    together they leave some plain ones; else a ``ValueError`` naming them
    (``VisionSettings`` checks its settings with this too)."""
    for name, share in (("recoloured", recoloured), ("reshaped", reshaped)):
        if not 0.0 <= share < 1.0:
            raise ValueError(f"{name} is a share of the training pictures in [0, 1), got {share}")
    if recoloured + reshaped >= 1.0:
        raise ValueError(f"recoloured ({recoloured}) + reshaped ({reshaped}) must stay below 1: "
                         "some training pictures must name both colour and shape")
    return recoloured, reshaped


def training_scene(seed: int, index: int, total: int, recoloured: float = 0.0,
                   reshaped: float = 0.0) -> Scene:
    """Scene ``index`` of a training set of ``total``: the last ``round(total * recoloured)``
    are ``"recoloured"`` scenes (shapes in an unnamed ink, captioned without a colour), the
    ``round(total * reshaped)`` before them ``"reshaped"`` ones (a palette colour in a ring or
    a diamond, captioned without a shape), the rest ``"train"`` scenes.

    Recolouring is SimCLR's colour augmentation made safe for the split: it shows every shape
    in many inks, so that a shape is learnt apart from its colour, and never in a palette
    colour held out with it. Reshaping is the same for colour: training names each colour with
    only three of the four shapes, so a shape is a hint about the colour, and a model that
    takes the hint names the wrong colour for a held-out pair; pictures whose colour is named
    and whose shape is not break that hint.

    >>> [training_scene(0, i, 6, recoloured=1/3, reshaped=1/3).pair for i in range(6)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('purple', 'square'), ('purple', 'triangle'), ('blue', 'ring'), ('yellow', 'ring'),
     ('', 'triangle'), ('', 'cross')]
    """
    check_shares(recoloured, reshaped)
    n_recoloured, n_reshaped = round(total * recoloured), round(total * reshaped)
    plain = total - n_recoloured - n_reshaped
    if index < plain:
        return make_scene(seed, "train", index)
    if index < plain + n_reshaped:
        return make_scene(seed, "reshaped", index - plain)
    return make_scene(seed, "recoloured", index - plain - n_reshaped)


def shape_mask(shape: str, cx: float, cy: float, radius: float,
               size: int = IMAGE_SIZE) -> np.ndarray:
    """Boolean (size, size) mask of one shape centred at (cx, cy) pixels (x right, y down),
    tested at each pixel's centre.

    >>> shape_mask("square", 2.0, 2.0, 1.0, size=4).astype(int)
    array([[0, 0, 0, 0],
           [0, 1, 1, 0],
           [0, 1, 1, 0],
           [0, 0, 0, 0]])
    """
    y, x = np.mgrid[0:size, 0:size] + 0.5  # (size, size) pixel centres
    dx, dy = x - cx, y - cy
    if shape == "circle":
        return dx**2 + dy**2 <= radius**2
    if shape == "square":  # a side of 1.8 r: about the circle's area
        return (np.abs(dx) <= 0.9 * radius) & (np.abs(dy) <= 0.9 * radius)
    if shape == "triangle":  # pointing up: apex at cy - r, base at cy + r
        depth = (dy + radius) / (2 * radius)  # 0 at the apex, 1 at the base
        return (depth >= 0) & (depth <= 1) & (np.abs(dx) <= radius * depth)
    if shape == "cross":  # a plus sign with arms a third of r thick on each side
        arm = radius / 3
        return ((np.abs(dx) <= arm) & (np.abs(dy) <= radius)) | (
            (np.abs(dy) <= arm) & (np.abs(dx) <= radius))
    if shape == "ring":  # unnamed: a disc with a hole of 0.55 r
        return (dx**2 + dy**2 <= radius**2) & (dx**2 + dy**2 >= (0.55 * radius) ** 2)
    if shape == "diamond":  # unnamed: a square on its corner
        return np.abs(dx) + np.abs(dy) <= 1.2 * radius
    raise ValueError(f"unknown shape {shape!r}; shapes: {', '.join(SHAPES + UNNAMED_SHAPES)}")


def render(scene: Scene, size: int = IMAGE_SIZE) -> np.ndarray:
    """The scene as an RGB picture, (size, size, 3) uint8."""
    image = np.empty((size, size, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    cell = size / GRID
    scale = size / IMAGE_SIZE
    for (row, col), (dx, dy) in zip(scene.cells, scene.offsets, strict=True):
        cx, cy = (col + 0.5) * cell + dx * scale, (row + 0.5) * cell + dy * scale
        image[shape_mask(scene.shape, cx, cy, RADIUS[scene.size] * scale, size)] = \
            scene.rgb or COLOURS[scene.colour]
    return image


def caption(scene: Scene, language: str = "en") -> str:
    """A sentence naming all five attributes, in English or Chinese (four for a recoloured
    scene: its ink has no name, so the caption names none; a reshaped scene's ring or diamond
    is just "shapes").

    >>> s = Scene("blue", "cross", 3, "small", "right", ((0, 2), (1, 2), (2, 3)), ((0, 0),) * 3)
    >>> caption(s), caption(s, "zh")
    ('three small blue crosses on the right', '右边有三个小的蓝色十字形')
    >>> recoloured = make_scene(0, "recoloured", 1)
    >>> recoloured.rgb, caption(recoloured), caption(recoloured, "zh")
    ((53, 156, 156), 'one big cross on the left', '左边有一个大的十字形')
    >>> reshaped = make_scene(0, "reshaped", 0)
    >>> reshaped.pair, caption(reshaped), caption(reshaped, "zh")
    (('blue', 'ring'), 'three small blue shapes on the left', '左边有三个小的蓝色图形')
    """
    c, s, n, z, side = scene.attributes()
    noun = s if s in SHAPES else "shape"  # an unnamed shape is just "a shape"
    if language == "en":
        return (f"{EN_COUNT[n]} {z} {c + ' ' if c else ''}{noun if n == 1 else PLURAL[noun]} "
                f"on the {side}")
    if language == "zh":
        return f"{ZH[side]}有{ZH_COUNT[n]}个{ZH[z]}的{ZH.get(c, '')}{ZH[noun]}"
    raise ValueError(f"unknown language {language!r}; languages: {', '.join(LANGUAGES)}")


def answers(kind: str, language: str) -> list[str]:
    """Every answer a question of ``kind`` can have (chance = 1 / their number).

    >>> answers("count", "zh"), answers("side", "zh")
    (['1', '2', '3'], ['左边', '右边'])
    """
    values = {"colour": list(COLOURS), "shape": list(SHAPES), "count": list(COUNTS),
              "size": list(SIZES), "side": list(SIDES)}[kind]
    if kind == "count":
        return [str(v) for v in values]
    return [ZH[v] for v in values] if language == "zh" else list(values)


def question(scene: Scene, kind: str, language: str = "en") -> tuple[str, str]:
    """``(question, exact answer)`` of one kind about the scene.

    subtle: no question names an attribute it does not ask about ("What colour are the
    shapes?", not "... the circles?"). Naming the shape would let a model guess the colour
    from the words alone (training never shows a red circle, so "circle" would rule out "red"),
    and a held-out question would test that shortcut instead of the picture.

    >>> s = make_scene(seed=0, split="held_out", index=3)
    >>> s.attributes()
    ('red', 'circle', 3, 'big', 'right')
    >>> question(s, "colour"), question(s, "count", "zh")
    (('What colour are the shapes?', 'red'), ('图中有几个图形？', '3'))
    """
    c, s, n, z, side = scene.attributes()
    if kind == "colour" and not c:
        raise ValueError("a recoloured scene's ink has no colour name: it has no colour question")
    if kind == "shape" and s not in SHAPES:
        raise ValueError(f"a reshaped scene's {s} has no shape name: it has no shape question")
    en = {"colour": (f"What colour {'is the shape' if n == 1 else 'are the shapes'}?", c),
          "shape": ("What shape is in the picture?", s),
          "count": ("How many shapes are there?", str(n)),
          "size": ("Are the shapes big or small?", z),
          "side": ("Are the shapes on the left or the right?", side)}
    zh = {"colour": ("图形是什么颜色？", ZH.get(c, c)),
          "shape": ("图中是什么形状？", ZH.get(s, s)),
          "count": ("图中有几个图形？", str(n)),
          "size": ("图形是大还是小？", ZH[z]),
          "side": ("图形在左边还是右边？", ZH[side])}
    table = {"en": en, "zh": zh}.get(language)
    if table is None:
        raise ValueError(f"unknown language {language!r}; languages: {', '.join(LANGUAGES)}")
    if kind not in table:
        raise ValueError(f"unknown question kind {kind!r}; kinds: {', '.join(QUESTION_KINDS)}")
    return table[kind]


def questions(scene: Scene) -> list[dict]:
    """All ten questions about a scene (five kinds x two languages) as records:
    ``{"kind", "language", "question", "answer"}``; a recoloured scene's colour questions
    and a reshaped scene's shape questions have no answer and are left out (eight)."""
    answerable = {"colour": bool(scene.colour), "shape": scene.shape in SHAPES}
    kinds = [k for k in QUESTION_KINDS if answerable.get(k, True)]
    return [{"kind": k, "language": lang, **dict(zip(("question", "answer"),
                                                     question(scene, k, lang), strict=True))}
            for lang in LANGUAGES for k in kinds]
