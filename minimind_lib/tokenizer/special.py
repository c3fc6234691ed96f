"""The special tokens (ids 0, 1, 2), MiniMind-3's tool and thinking markers (the course
tokenizer's ids 3-8), and MiniMind2's
Jinja chat template that spells them: the only home of these strings in the library
(``tests/test_layout.py`` checks it).
"""

from __future__ import annotations

#: The special tokens, ids 0, 1, 2 (the only home of these strings in the library).
END_OF_TEXT = "<|endoftext|>"  # ends a document in the pretraining stream; also the pad token
IM_START = "<|im_start|>"  # opens a chat turn: <|im_start|>role\ncontent<|im_end|>
IM_END = "<|im_end|>"  # closes a chat turn: the chat model's stop token
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant"

#: MiniMind-3's markers (its ids 21-26): one id each in a tokenizer that reserves them.
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"  # wrap one JSON call in a reply
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"  # wrap a tool's result
THINK, THINK_END = "<think>", "</think>"  # wrap the reasoning that opens every MiniMind-3 reply
TOOL_AND_THINK_TOKENS = [TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END, THINK,
                         THINK_END]
#: The course tokenizer's reserved ids 0-8: ChatML's three, then MiniMind-3's six markers, so
#: the course model speaks MiniMind-3's chat format (``scripts/train_tokenizer.py``).
COURSE_SPECIAL_TOKENS = SPECIAL_TOKENS + TOOL_AND_THINK_TOKENS

#: MiniMind2's Jinja chat template (its tool-calling branch left out), saved in
#: tokenizer_config.json so ``transformers``' ``apply_chat_template`` renders the same text.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)
