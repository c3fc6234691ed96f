"""Inference (notebook 08): talking to a model.

* ``chat``: sampling parameters, the token stream, ``ChatSession`` and the terminal chat;
* ``loading``: a model folder (text or vision) and its tokenizer, ready to talk to;
* ``serve``: the OpenAI-compatible HTTP server and its chat page;
* ``structured``: grammar-constrained decoding (notebook 18): a JSON Schema or the tools'
  call format as one token mask per step;
* ``export``: a model folder as one GGUF file or a Hugging Face folder;
* ``harness``: a model inside lm-evaluation-harness (the ``"minimind"`` model, ``bench``;
  needs the ``[eval]`` extra, so nothing imports it unasked).
"""
