"""The course: how the concepts below are run, stage by stage, in a profile.

* ``profiles``: smoke / cpu / gpu / full, the one switch that sizes everything; overrides;
* ``stages``: the one registry of stages (tokenizer -> pretrain -> sft -> dpo -> quantize,
  and grpo, lora, vision), each a function of a ``StageContext``;
* ``pipeline``: ``ensure(stage, profile)``: reuse a finished run or produce it, and say why;
* ``plan``: tokens, steps and time a profile needs on the data present;
* ``report``: ``report.md`` from the stage folders;
* ``exercises``: every notebook's exercise checks; ``quoted``: the figures a notebook quotes,
  checked by its run; ``plotting``, ``widgets``: the pictures.
"""
