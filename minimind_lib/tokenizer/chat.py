"""The chat templates (notebooks 01 and 05), rendered as text (``apply_chat_template``) or as
ids whose markers are special ids while message content is never parsed for special tokens
(``encode_chat``):

* ``"minimind-3"`` (the default): MiniMind-3's, the course model's format (``tools`` in the
  system turn, ``<tool_call>`` JSON per call, tool results as ``<tool_response>`` user turns, a
  ``<think>`` block opening every reply), rendered exactly as its ``tokenizer_config.json``
  template renders through ``transformers`` (``minimind_lib.tokenizer.chat3`` holds it);
* ``"minimind2"``: MiniMind2's ChatML (a default system turn when none is given), for
  MiniMind2's weights, whose tokenizer has no markers (``template_of``).
"""

from __future__ import annotations

from collections.abc import Sequence

from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat3 import minimind3_pieces, reserves_markers
from minimind_lib.tokenizer.special import (
    DEFAULT_SYSTEM_PROMPT,
    IM_END,
    IM_START,
)

CHAT_ROLES = ("system", "user", "assistant")


class TemplateMismatch(ValueError):
    """A valid conversation that the chosen template cannot express (a tool call in
    MiniMind2's ChatML): datasets skip and count such records."""


#: The templates by name; the first is the course model's (``template=`` picks another).
CHAT_TEMPLATES = ("minimind-3", "minimind2")


def chat_parts(messages: Sequence[dict], add_generation_prompt: bool = False, *,
               tools: Sequence[dict] | None = None, open_thinking: bool = False,
               template: str = "minimind-3") -> list[tuple[str, bool]]:
    """The rendered conversation as ``(text, is_special_marker)`` parts.

    ``tools`` and ``open_thinking`` belong to MiniMind-3's template (MiniMind2's has neither).

    >>> chat_parts([{"role": "user", "content": "hi"}], True, template="minimind2")[-3:]
    [('\\n', False), ('<|im_start|>', True), ('assistant\\n', False)]
    >>> chat_parts([{"role": "user", "content": "hi"}], add_generation_prompt=True)[-4:]
    [('<think>', True), ('\\n\\n', False), ('</think>', True), ('\\n\\n', False)]
    """
    if template == "minimind-3":
        pieces = minimind3_pieces(messages, add_generation_prompt, tools=tools,
                                  open_thinking=open_thinking)
        return [(text, special) for text, special, _ in pieces]
    if template != "minimind2":
        raise ValueError(f"unknown chat template {template!r}; choose one of "
                         f"{', '.join(CHAT_TEMPLATES)}")
    if tools or open_thinking:
        raise ValueError("MiniMind2's chat template has no tools and no thinking; use "
                         "template='minimind-3'")
    if not messages:
        raise ValueError("a conversation needs at least one message")
    for i, m in enumerate(messages):
        if isinstance(m, dict) and (m.get("role") == "tool" or any(
                m.get(k) for k in ("tools", "tool_calls", "reasoning_content"))):
            raise TemplateMismatch(f"messages[{i}] holds tools or thinking, which MiniMind2's "
                                   "chat template cannot express; use template='minimind-3'")
        if (not isinstance(m, dict) or m.get("role") not in CHAT_ROLES
                or not isinstance(m.get("content"), str)):
            raise ValueError(f"messages[{i}] must be {{'role': one of {', '.join(CHAT_ROLES)}, "
                             f"'content': str}}, got {m!r}")
    turns = [(m["role"], m["content"]) for m in messages]
    if turns[0][0] != "system":
        turns.insert(0, ("system", DEFAULT_SYSTEM_PROMPT))
    parts: list[tuple[str, bool]] = []
    for role, content in turns:
        parts += [(IM_START, True), (f"{role}\n{content}", False), (IM_END, True),
                  ("\n", False)]
    if add_generation_prompt:
        parts += [(IM_START, True), ("assistant\n", False)]
    return parts


def apply_chat_template(messages: Sequence[dict], add_generation_prompt: bool = False, *,
                        tools: Sequence[dict] | None = None, open_thinking: bool = False,
                        template: str = "minimind-3") -> str:
    """Render ``messages`` in ``template``: MiniMind-3's with ``tools`` and ``open_thinking``,
    or MiniMind2's ChatML (a default system message when none).

    >>> print(apply_chat_template([{"role": "user", "content": "你好"}],
    ...                           add_generation_prompt=True, template="minimind2"))
    <|im_start|>system
    You are a helpful assistant<|im_end|>
    <|im_start|>user
    你好<|im_end|>
    <|im_start|>assistant
    <BLANKLINE>
    >>> print(apply_chat_template([{"role": "user", "content": "你好"}], True,
    ...                           open_thinking=True))
    <|im_start|>user
    你好<|im_end|>
    <|im_start|>assistant
    <think>
    <BLANKLINE>
    """
    return "".join(text for text, _ in chat_parts(messages, add_generation_prompt, tools=tools,
                                                  open_thinking=open_thinking, template=template))


def template_of(tokenizer: BPETokenizer) -> str:
    """The chat template a tokenizer's model speaks: MiniMind-3's when the tokenizer reserves
    its ``<think>`` and ``<tool_call>`` markers (the course tokenizer, ids 3-8, and MiniMind-3's
    own, ids 21-26, do), else MiniMind2's (MiniMind2's tokenizer has only ChatML's three).

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> from minimind_lib.tokenizer.training import train_bpe
    >>> template_of(load_tokenizer()), template_of(train_bpe(["ab ab"], 260, show_progress=False))
    ('minimind-3', 'minimind2')
    """
    return "minimind-3" if reserves_markers(tokenizer) else "minimind2"


def encode_chat(tokenizer: BPETokenizer, messages: Sequence[dict],
                add_generation_prompt: bool = False, *, tools: Sequence[dict] | None = None,
                open_thinking: bool = False, template: str | None = None) -> list[int]:
    """Ids of the rendered chat: markers are special ids, and message content is never
    parsed for special tokens, so typed ``<|im_end|>`` text cannot forge a turn. A marker the
    tokenizer lacks (MiniMind-3's ``<think>`` in a MiniMind2 tokenizer) is an error naming it.
    ``template`` None: the tokenizer's own (``template_of``).

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> ids = encode_chat(tok, [{"role": "user", "content": "<|im_end|>"}])
    >>> ids.count(tok.token_to_id("<|im_end|>"))   # the user turn's only
    1
    """
    template = template or template_of(tokenizer)
    ids: list[int] = []
    for text, special in chat_parts(messages, add_generation_prompt, tools=tools,
                                    open_thinking=open_thinking, template=template):
        ids += ([marker_id(tokenizer, text, template)] if special
                else tokenizer.encode(text, allowed_special=set()))
    return ids


def marker_id(tokenizer: BPETokenizer, marker: str, template: str = "minimind-3") -> int:
    """The special id of a template marker; an error naming the marker when it has none.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> marker_id(load_tokenizer(), "<|im_end|>")
    2
    """
    if not tokenizer.reserves(marker):  # per marker of every example: a set lookup
        raise ValueError(f"this tokenizer has no special token {marker!r}, which the "
                         f"{template} chat template needs as one id (its special tokens: "
                         f"{', '.join(tokenizer.special_tokens)}); use a tokenizer that "
                         "reserves it (add_special_tokens) or another template")
    return tokenizer.token_to_id(marker)
