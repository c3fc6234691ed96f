"""Generate SFT conversations, DPO pairs and held-out eval sets with checkable answers.

Two families of tasks:

* **knowledge**: facts stated in the pretraining text (poem lines and authors, idiom
  meanings, English definitions; CC BY-SA: word and sentence translations).  Whole items
  (a poem, an idiom, a word, a sentence) are held out for evaluation.
* **skill**: what a small model learns in minutes (copy a phrase, 1-digit arithmetic,
  find the title inside 《》, the first word of a sentence, the larger of two numbers).
  Held-out eval prompts never appear in training.

Every task has many phrasings; each record carries ``task`` and ``family``.  DPO's
rejected answer is an unrelated answer of the same task (another line, poet, meaning,
phrase ...), or an off-by-one/two result for arithmetic; see ../shared/DATA_SOURCES.md.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import data_pretrain as dp
import data_sources as ds

#: per-mille of the knowledge items (poems, idioms, words, entries, sentences) held out
EVAL_ITEMS_PER_MILLE = 100

CLEAN_ZH = re.compile(r"[\u4e00-\u9fff，。；：、？！（）《》·]+")
ZH_CLAUSE = re.compile(r"[^，。？！；：]+[，。？！；：]")


@dataclass(frozen=True)
class QA:
    """One question with its reference answer and DPO rejected candidates."""

    task: str
    prompt: str
    answer: str
    rejected: str | None  # an answer that is wrong for this prompt


@dataclass(frozen=True)
class Task:
    name: str
    family: str  # "knowledge" | "skill"
    cc_by_sa: bool
    make: Callable  # (corpus, rng) -> (train QAs, eval QAs)


@dataclass(frozen=True)
class TaskPlan:
    """How many records per task in each file."""

    sft: dict[str, int]
    dpo: dict[str, int]
    sft_eval: int
    dpo_eval: int

    @classmethod
    def sample(cls) -> TaskPlan:
        sft = {t.name: (1400 if t.family == "skill" else 1150) for t in TASKS}
        sft.update(word_translation=1000, sentence_translation=1000)
        return cls(sft=sft, dpo={t.name: 420 for t in TASKS}, sft_eval=120, dpo_eval=100)

    @classmethod
    def full(cls) -> TaskPlan:
        # more knowledge items (each is a different fact); skills saturate sooner
        sft = {t.name: (4000 if t.family == "skill" else 8000) for t in TASKS}
        return cls(sft=sft, dpo={t.name: 4000 for t in TASKS}, sft_eval=120, dpo_eval=100)


@dataclass
class Sets:
    """Everything written to data/: training files and held-out eval files."""

    sft: list[dict] = field(default_factory=list)
    sft_cc: list[dict] = field(default_factory=list)
    dpo: list[dict] = field(default_factory=list)
    dpo_cc: list[dict] = field(default_factory=list)
    sft_eval: list[dict] = field(default_factory=list)
    sft_eval_cc: list[dict] = field(default_factory=list)
    dpo_eval: list[dict] = field(default_factory=list)
    dpo_eval_cc: list[dict] = field(default_factory=list)


def item_heldout(key: str) -> bool:
    """Is this knowledge item (or skill prompt) reserved for evaluation? Stable across builds."""
    return ds.stable_hash("eval:" + key) % 1000 < EVAL_ITEMS_PER_MILLE


def rng_for(name: str) -> random.Random:
    return random.Random(ds.stable_hash("rng:" + name))


def clauses(poem: ds.Poem) -> list[str]:
    """A poem's clauses, each with its closing punctuation.

    >>> clauses(ds.Poem("静夜思", "李白", ("床前明月光，疑是地上霜。",), "tang300", True))
    ['床前明月光，', '疑是地上霜。']
    """
    return [c for line in poem.lines for c in ZH_CLAUSE.findall(line)]


def _pick_other(rng: random.Random, pool: list[str],
                wrong_for: Callable[[str], bool]) -> str | None:
    """A random member of ``pool`` for which ``wrong_for`` holds (None after 50 misses)."""
    for _ in range(50):
        x = pool[rng.randrange(len(pool))]
        if wrong_for(x):
            return x
    return None


# --- knowledge ---------------------------------------------------------------------------

NEXT_LINE = ["“{q}”的下一句是什么？", "“{q}”的下一句是？", "请接下句：“{q}”",
             "“{q}”，下一句是什么？", "“{q}”后面一句是什么？", "诗句“{q}”的下一句怎么写？",
             "补全诗句：“{q}”的下一句", "“{q}”下一句是哪句？", "请说出“{q}”的下一句。",
             "接着背：“{q}”"]


def poem_next_line(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """“床前明月光”的下一句是什么？ -> 疑是地上霜，  (the answer keeps its punctuation)."""
    count: dict[str, int] = {}
    for p in c.poems:
        for cl in clauses(p):
            count[cl[:-1]] = count.get(cl[:-1], 0) + 1
    by_len: dict[int, list[str]] = {}
    for p in c.poems:
        for cl in clauses(p):
            by_len.setdefault(len(cl), []).append(cl)
    train, evals = [], []
    for p in c.poems:
        cls = clauses(p)
        # subtle: a line that occurs in two poems has two "next lines"; ask only unique ones
        pairs = [(a[:-1], b) for a, b in zip(cls, cls[1:], strict=False)
                 if count[a[:-1]] == 1 and len(a) >= 5 and len(b) >= 5]
        if not pairs:
            continue
        q, a = pairs[rng.randrange(len(pairs))]
        other = _pick_other(rng, by_len[len(a)], lambda x, a=a: x[:-1] != a[:-1])
        rejected = other[:-1] + a[-1] if other else None
        qa = QA("poem_next_line", NEXT_LINE[rng.randrange(len(NEXT_LINE))].format(q=q), a, rejected)
        (evals if item_heldout(dp.poem_key(p)) else train).append(qa)
    return train, evals


AUTHOR_BY_TITLE = ["《{t}》的作者是谁？", "《{t}》是谁写的？", "谁写了《{t}》？",
                   "诗歌《{t}》出自哪位诗人之手？", "《{t}》这首诗的作者是？",
                   "请问《{t}》是哪位诗人的作品？"]
AUTHOR_BY_LINE = ["“{q}”是哪位诗人写的？", "“{q}”出自谁的诗？", "“{q}”这句诗的作者是谁？",
                  "写下“{q}”的诗人是谁？"]


def poem_author(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """《静夜思》的作者是谁？ -> 李白 (asked by title when unique, else by a unique first line)."""
    titles: dict[str, int] = {}
    lines: dict[str, int] = {}
    for p in c.poems:
        titles[p.title] = titles.get(p.title, 0) + 1
        for cl in clauses(p):
            lines[cl[:-1]] = lines.get(cl[:-1], 0) + 1
    authors = sorted({p.author for p in c.poems})
    train, evals = [], []
    for p in c.poems:
        first = clauses(p)[0][:-1] if clauses(p) else ""
        if titles[p.title] == 1 and rng.random() < 0.7:
            prompt = AUTHOR_BY_TITLE[rng.randrange(len(AUTHOR_BY_TITLE))].format(t=p.title)
        elif len(first) >= 4 and lines[first] == 1:
            prompt = AUTHOR_BY_LINE[rng.randrange(len(AUTHOR_BY_LINE))].format(q=first)
        elif titles[p.title] == 1:
            prompt = AUTHOR_BY_TITLE[rng.randrange(len(AUTHOR_BY_TITLE))].format(t=p.title)
        else:
            continue
        rejected = _pick_other(rng, authors, lambda x, a=p.author: x != a)
        qa = QA("poem_author", prompt, p.author, rejected)
        (evals if item_heldout(dp.poem_key(p)) else train).append(qa)
    return train, evals


IDIOM = ["成语“{w}”是什么意思？", "“{w}”这个成语是什么意思？", "请解释成语“{w}”。",
         "“{w}”是什么意思？", "成语“{w}”的意思是？", "“{w}”的释义是什么？", "你知道“{w}”的意思吗？"]


def idiom_meaning(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """成语“守株待兔”是什么意思？ -> the explanation stated in the pretraining text."""
    # short explanations in plain Chinese (a few source entries carry stray symbols like "≤")
    pool = [i for i in c.idioms if len(i.explanation) <= 40 and CLEAN_ZH.fullmatch(i.explanation)]
    meanings = [i.explanation for i in pool]
    train, evals = [], []
    for i in pool:
        rejected = _pick_other(rng, meanings, lambda x, e=i.explanation: x != e)
        qa = QA("idiom_meaning", IDIOM[rng.randrange(len(IDIOM))].format(w=i.word), i.explanation,
                rejected)
        (evals if item_heldout("idiom/" + i.word) else train).append(qa)
    return train, evals


DEFINE = ['What does the word "{w}" mean?', 'Define "{w}".', 'What is the meaning of "{w}"?',
          'Give a short definition of the {pos} "{w}".', 'What does "{w}" mean?',
          'Explain the word "{w}".', '"{w}": what does it mean?', 'What is a definition of "{w}"?']


def word_definition(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """What does the word "fox" mean? -> its WordNet definition (without the examples)."""
    definitions = [w.definition for w in c.words]
    train, evals = [], []
    for w in c.words:
        prompt = DEFINE[rng.randrange(len(DEFINE))].format(w=w.word, pos=w.pos)
        rejected = _pick_other(rng, definitions, lambda x, d=w.definition: x != d)
        qa = QA("word_definition", prompt, w.definition, rejected)
        (evals if item_heldout("word/" + w.word) else train).append(qa)
    return train, evals


TRANSLATE_WORD = ["“{w}”用英语怎么说？", "“{w}”的英文是什么？", "请把“{w}”翻译成英语。",
                  'How do you say "{w}" in English?',
                  'What does the Chinese word "{w}" mean in English?', "“{w}”翻译成英文是什么？"]


def word_translation(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """“学习”用英语怎么说？ -> to learn; to study  (CC-CEDICT, CC BY-SA)."""
    glosses = ["; ".join(e.senses) for e in c.cedict]
    train, evals = [], []
    for e, gloss in zip(c.cedict, glosses, strict=True):
        prompt = TRANSLATE_WORD[rng.randrange(len(TRANSLATE_WORD))].format(w=e.simplified)
        rejected = _pick_other(rng, glosses, lambda x, g=gloss: x != g)
        qa = QA("word_translation", prompt, gloss, rejected)
        (evals if item_heldout("cedict/" + e.simplified) else train).append(qa)
    return train, evals


TO_EN = ["把这句话翻译成英文：{s}", "请翻译成英语：{s}", "用英语怎么说：{s}",
         "Translate into English: {s}", "Translate this Chinese sentence into English: {s}"]
TO_ZH = ["Translate into Chinese: {s}", "把下面的英文翻译成中文：{s}", "请翻译成中文：{s}",
         "How do you say this in Chinese: {s}"]


def sentence_translation(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """HSK sentence pairs, both directions (CC BY-SA); the sentence ends the prompt."""
    en = [s.english for s in c.hsk]
    zh = [s.chinese for s in c.hsk]
    train, evals = [], []
    for s in c.hsk:
        if rng.random() < 0.5:
            prompt = TO_EN[rng.randrange(len(TO_EN))].format(s=s.chinese)
            qa = QA("sentence_translation", prompt, s.english,
                    _pick_other(rng, en, lambda x, a=s.english: x != a))
        else:
            prompt = TO_ZH[rng.randrange(len(TO_ZH))].format(s=s.english)
            qa = QA("sentence_translation", prompt, s.chinese,
                    _pick_other(rng, zh, lambda x, a=s.chinese: x != a))
        (evals if item_heldout("hsk/" + s.key) else train).append(qa)
    return train, evals


# --- skills ------------------------------------------------------------------------------

COPY_ZH = ["请重复这句话：“{p}”", "请把“{p}”再说一遍。", "跟我说：“{p}”", "原样复述：“{p}”",
           "请照抄下面的句子：“{p}”", "重复一遍：“{p}”", "把这段话原封不动地写出来：“{p}”",
           "请你复述“{p}”。"]
COPY_EN = ['Repeat after me: "{p}"', 'Please repeat this phrase exactly: "{p}"', 'Say "{p}" again.',
           'Copy this text: "{p}"', 'Echo the following words: "{p}"', 'Write "{p}" back to me.',
           'Can you repeat "{p}"?', 'Repeat exactly: "{p}"']


def _split_by_item(items: list[str], prefix: str) -> tuple[list[str], list[str]]:
    """(train items, eval items), deduplicated, in a stable order."""
    unique = dp.hash_order(list(dict.fromkeys(items)), lambda x: prefix + x)
    return ([x for x in unique if not item_heldout(prefix + x)],
            [x for x in unique if item_heldout(prefix + x)])


def _copy(task: str, phrases: list[str], templates: list[str], rng: random.Random
          ) -> tuple[list[QA], list[QA]]:
    train_p, eval_p = _split_by_item(phrases, task + "/")
    out: tuple[list[QA], list[QA]] = ([], [])
    for part, pool in zip(out, (train_p, eval_p), strict=True):
        for p in pool:
            rejected = _pick_other(rng, pool, lambda x, p=p: x != p)
            part.append(QA(task, templates[rng.randrange(len(templates))].format(p=p), p, rejected))
    return out


def copy_zh(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """请重复这句话：“春眠不觉晓” -> 春眠不觉晓  (poem lines and modern idiom explanations)."""
    phrases = [cl[:-1] for p in c.poems for cl in clauses(p) if 4 <= len(cl) - 1 <= 12]
    phrases += [x for i in c.idioms for x in re.split(r"[，。；：、？！]", i.explanation)
                if 4 <= len(x) <= 12 and re.fullmatch(r"[\u4e00-\u9fff]+", x)]
    return _copy("copy_zh", phrases, COPY_ZH, rng)


def copy_en(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """Repeat after me: "the jury said" -> the jury said  (3-7 word spans of Brown sentences)."""
    phrases = []
    for d in c.docs:
        if d.source != "brown":
            continue
        words = d.text.split()
        for start in range(0, len(words) - 8, 23):  # a few spans per chunk, spread out
            span = words[start:start + 3 + (start // 23) % 5]
            phrase = " ".join(span).strip(",;:.")
            if re.fullmatch(r"[A-Za-z][A-Za-z ,'-]*[A-Za-z]", phrase):
                phrases.append(phrase)
    return _copy("copy_en", phrases, COPY_EN, rng)


ARITH_ZH = ["{e} 等于多少？", "计算：{e}", "{e} = ?", "请算一算 {e} 的结果。", "{e} 的结果是多少？",
            "算一下：{e}", "{e} 得几？", "请问 {e} 等于几？", "口算：{e}", "{e} 是多少？"]
ARITH_EN = ["What is {e}?", "Compute {e}.", "Calculate {e}, please.", "{e} equals what?",
            "What does {e} equal?", "Work out {e}.", "Solve: {e}", "{e} = ?", "Quick: {e}",
            "How much is {e}?"]


def arithmetic(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """3 + 5 等于多少？ -> 3 + 5 = 8  (one-digit + and -, results never negative)."""
    del c
    exprs = [(a, op, b) for a in range(10) for b in range(10) for op in "+-" if op == "+" or a >= b]
    train, evals = [], []
    for a, op, b in exprs:
        e = f"{a} {op} {b}"
        value = a + b if op == "+" else a - b
        answer = f"{e} = {value}"
        for template in ARITH_ZH + ARITH_EN:
            prompt = template.format(e=e)
            if rng.random() < 0.5:  # off by one or two (never negative, never right)
                wrong = value + rng.choice([d for d in (-2, -1, 1, 2) if value + d >= 0])
                rejected = f"{e} = {wrong}"
            else:  # an unrelated equation: true in itself, but not the answer asked for
                x, xop, y = exprs[rng.randrange(len(exprs))]
                rejected = f"{x} {xop} {y} = {x + y if xop == '+' else x - y}"
                if rejected == answer:
                    rejected = f"{e} = {value + 1}"
            (evals if item_heldout("arith/" + prompt) else train).append(
                QA("arithmetic", prompt, answer, rejected))
    return train, evals


TITLE_SENTENCES = ["我最近在读《{t}》，写得很好。", "老师让我们背诵《{t}》。",
                   "《{t}》是一首很有名的诗。", "昨天晚上，我又读了一遍《{t}》。",
                   "你听说过《{t}》吗？", "他最喜欢的诗是《{t}》。", "课本里收录了《{t}》。",
                   "我们今天学习《{t}》这首诗。"]
TITLE_QUESTIONS = ["下面这句话里书名号中的标题是什么？{s}", "找出句子中《》里的内容：{s}",
                   "这句话提到了哪部作品？{s}", "请提取书名号里的标题：{s}",
                   "句子“{s}”中的书名是什么？"]


def extract_title(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """找出句子中《》里的内容：老师让我们背诵《静夜思》。 -> 静夜思."""
    titles = [p.title for p in c.poems if len(p.title) <= 10]
    train_t, eval_t = _split_by_item(titles, "title/")
    out: tuple[list[QA], list[QA]] = ([], [])
    for part, pool in zip(out, (train_t, eval_t), strict=True):
        for t in pool:
            s = TITLE_SENTENCES[rng.randrange(len(TITLE_SENTENCES))].format(t=t)
            prompt = TITLE_QUESTIONS[rng.randrange(len(TITLE_QUESTIONS))].format(s=s)
            part.append(QA("extract_title", prompt, t,
                           _pick_other(rng, pool, lambda x, t=t: x != t)))
    return out


FIRST_WORD = ['What is the first word of the sentence "{s}"?', 'Give the first word of: "{s}"',
              'Which word comes first in "{s}"?', 'Tell me the first word in "{s}".',
              'Sentence: "{s}" What is its first word?', 'Name the first word of "{s}".']


def first_word(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """What is the first word of the sentence "The jury said ..."? -> The  (Brown, Austen)."""
    sentences = []
    for d in c.docs:
        if d.source in ("brown", "austen"):
            sentences += [s for s in re.split(r"(?<=[.!?]) (?=[A-Z])", d.text.replace("\n", " "))
                          if 4 <= len(s.split()) <= 20 and '"' not in s and s.split()[0].isalpha()]
    train_s, eval_s = _split_by_item(sentences, "first/")
    out: tuple[list[QA], list[QA]] = ([], [])
    for part, pool in zip(out, (train_s, eval_s), strict=True):
        for s in pool:
            words = s.split()
            first = words[0]
            second = words[1].strip(",;:.!?")
            rejected = second if second.isalpha() and second != first else words[-1].strip(",;:.!?")
            prompt = FIRST_WORD[rng.randrange(len(FIRST_WORD))].format(s=s)
            part.append(QA("first_word", prompt, first, rejected if rejected != first else None))
    return out


LARGER = ["{a} 和 {b} 哪个大？", "{a} 与 {b} 相比，哪个数更大？",
          "比较 {a} 和 {b}，较大的是哪一个？", "{a} 和 {b} 中较大的数是？",
          "Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?",
          "Of {a} and {b}, which is greater?", "Pick the larger number: {a} or {b}."]


def larger_number(c: dp.Corpus, rng: random.Random) -> tuple[list[QA], list[QA]]:
    """7 和 3 哪个大？ -> 7  (two different numbers below 100)."""
    del c
    train, evals = [], []
    for a in range(100):
        for b in range(100):
            # subtle: 9,900 ordered pairs x 8 phrasings is far more than needed; keep 1 in 4
            if a == b or ds.stable_hash(f"pair:{a}:{b}") % 4:
                continue
            prompt = LARGER[rng.randrange(len(LARGER))].format(a=a, b=b)
            qa = QA("larger_number", prompt, str(max(a, b)), str(min(a, b)))
            (evals if item_heldout(f"larger/{a}/{b}") else train).append(qa)
    return train, evals


TASKS = [
    Task("poem_next_line", "knowledge", False, poem_next_line),
    Task("poem_author", "knowledge", False, poem_author),
    Task("idiom_meaning", "knowledge", False, idiom_meaning),
    Task("word_definition", "knowledge", False, word_definition),
    Task("word_translation", "knowledge", True, word_translation),
    Task("sentence_translation", "knowledge", True, sentence_translation),
    Task("copy_zh", "skill", False, copy_zh),
    Task("copy_en", "skill", False, copy_en),
    Task("arithmetic", "skill", False, arithmetic),
    Task("extract_title", "skill", False, extract_title),
    Task("first_word", "skill", False, first_word),
    Task("larger_number", "skill", False, larger_number),
]


def sft_record(qa: QA, family: str, with_answer: bool = False) -> dict:
    r = {"conversations": [{"role": "user", "content": qa.prompt},
                           {"role": "assistant", "content": qa.answer}],
         "task": qa.task, "family": family}
    if with_answer:
        r["answer"] = qa.answer
    return r


def dpo_record(qa: QA, family: str) -> dict:
    user = {"role": "user", "content": qa.prompt}
    return {"chosen": [user, {"role": "assistant", "content": qa.answer}],
            "rejected": [user, {"role": "assistant", "content": qa.rejected}],
            "task": qa.task, "family": family}


def build_sets(c: dp.Corpus, plan: TaskPlan) -> Sets:
    """All SFT/DPO training and eval records for ``plan``, eval prompts disjoint from training."""
    sets = Sets()
    for task in TASKS:
        rng = rng_for(task.name)
        train, evals = task.make(c, rng)
        eval_prompts = {qa.prompt for qa in evals}
        # subtle: two items can share a phrasing (a title, a number pair); drop such collisions
        train = [qa for qa in train if qa.prompt not in eval_prompts]
        rng.shuffle(train)
        rng.shuffle(evals)
        sft_eval = _dedup(evals)[:plan.sft_eval]
        dpo_eval = [qa for qa in _dedup(evals) if qa.rejected][:plan.dpo_eval]
        sft = _dedup(train)[:plan.sft[task.name]]
        # DPO prompts: other training items first, so SFT and DPO see more different items
        dpo_pool = [qa for qa in _dedup(train)[plan.sft[task.name]:] + sft if qa.rejected]
        dpo = dpo_pool[:plan.dpo[task.name]]
        f = task.family
        (sets.sft_cc if task.cc_by_sa else sets.sft).extend(sft_record(qa, f) for qa in sft)
        (sets.dpo_cc if task.cc_by_sa else sets.dpo).extend(dpo_record(qa, f) for qa in dpo)
        (sets.sft_eval_cc if task.cc_by_sa else sets.sft_eval).extend(
            sft_record(qa, f, True) for qa in sft_eval)
        (sets.dpo_eval_cc if task.cc_by_sa else sets.dpo_eval).extend(
            dpo_record(qa, f) for qa in dpo_eval)
    for name in ("sft", "sft_cc", "dpo", "dpo_cc", "sft_eval", "sft_eval_cc", "dpo_eval",
                 "dpo_eval_cc"):
        setattr(sets, name, dp.shuffled(getattr(sets, name), seed=ds.stable_hash(name) % 2**32))
    return sets


def _dedup(qas: list[QA]) -> list[QA]:
    """First QA per prompt (a prompt must have exactly one reference answer)."""
    seen: dict[str, QA] = {}
    for qa in qas:
        seen.setdefault(qa.prompt, qa)
    return list(seen.values())
