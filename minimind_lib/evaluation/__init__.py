"""Evaluation (notebooks 05-07, 12): held-out scores of a model.

* ``questions``: the held-out question sets, answers generated and scored (exact match, F1);
* ``perplexity``: perplexity and bits per byte on held-out text;
* ``preferences``: whether a model prefers the chosen answer of held-out pairs;
* ``model_eval``: one model's scores as ``eval.json``;
* ``long_context``: perplexity and loss past the training length;
* ``precision``: fp32 / fp16 / bf16 / int8 side by side (size, speed, quality);
* ``multiple_choice``: each choice's log-likelihood as a continuation, ``acc`` / ``acc_norm``
  as lm-evaluation-harness reports them;
* ``tool_use``: tool calls and thinking on the held-out tool questions.
"""
