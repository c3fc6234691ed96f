"""The chat template (notebooks 01 and 05): MiniMind2's ChatML rendered as text
(``apply_chat_template``) or as ids whose role markers are special ids while message content is
never parsed for special tokens (``encode_chat``).
"""

from __future__ import annotations

from collections.abc import Sequence

from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.special import DEFAULT_SYSTEM_PROMPT, IM_END, IM_START

CHAT_ROLES = ("system", "user", "assistant")


def chat_parts(messages: Sequence[dict],
               add_generation_prompt: bool = False) -> list[tuple[str, bool]]:
    """The rendered conversation as ``(text, is_special_marker)`` parts.

    >>> chat_parts([{"role": "user", "content": "hi"}], add_generation_prompt=True)[-3:]
    [('\\n', False), ('<|im_start|>', True), ('assistant\\n', False)]
    """
    if not messages:
        raise ValueError("a conversation needs at least one message")
    for i, m in enumerate(messages):
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


def apply_chat_template(messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    """Render ``messages`` in MiniMind2's ChatML (default system message when none).

    >>> print(apply_chat_template([{"role": "user", "content": "你好"}],
    ...                           add_generation_prompt=True))
    <|im_start|>system
    You are a helpful assistant<|im_end|>
    <|im_start|>user
    你好<|im_end|>
    <|im_start|>assistant
    <BLANKLINE>
    """
    return "".join(text for text, _ in chat_parts(messages, add_generation_prompt))


def encode_chat(tokenizer: BPETokenizer, messages: Sequence[dict],
                add_generation_prompt: bool = False) -> list[int]:
    """Ids of the rendered chat: role markers are special ids, and message content is
    never parsed for special tokens, so typed ``<|im_end|>`` text cannot forge a turn.

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> ids = encode_chat(tok, [{"role": "user", "content": "<|im_end|>"}])
    >>> ids.count(tok.token_to_id("<|im_end|>"))   # system + user turns only
    2
    """
    ids: list[int] = []
    for text, special in chat_parts(messages, add_generation_prompt):
        ids += ([tokenizer.token_to_id(text)] if special
                else tokenizer.encode(text, allowed_special=set()))
    return ids
