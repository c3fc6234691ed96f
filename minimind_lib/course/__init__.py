"""The course: how the concepts below are run, stage by stage, in a profile.

* ``profiles``: smoke / cpu / gpu / full, the one switch that sizes everything; overrides;
* ``stages``: the one registry of stages (tokenizer -> pretrain -> sft -> dpo -> quantize,
  and grpo, lora, vision, distill; ``stages_agent`` and ``stages_ppo`` add agent and ppo),
  each a function of a ``StageContext``;
* ``pipeline``: ``ensure(stage, profile)``: reuse a finished run or produce it, and say why;
* ``plan``: tokens, steps and time a profile needs on the data present;
* ``report``: ``report.md`` from the stage folders;
* ``exercises``: every notebook's exercise checks; ``quoted``: the figures a notebook quotes,
  checked by its run; ``plotting``, ``widgets``: the pictures.
"""

# The registry fills in one order whichever course module is imported first: ``stages``
# registers its own stages, then imports the modules that register more (agent, ppo), whose
# stages require its. Importing ``stages_agent`` before ``stages`` would register agent first.
from minimind_lib.course import stages as _stages  # noqa: E402, F401
