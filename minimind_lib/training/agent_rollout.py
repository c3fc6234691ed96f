"""Multi-turn rollouts with tools, the data of agentic RL (notebook 15).

An agent's episode is not one reply: the model writes a turn, the turn may call tools, the
tools' results come back as a ``tool`` turn, and the model writes again, until it answers
without a call (or runs out of rounds). Reinforcement learning on such an episode needs three
things a single-turn rollout (``training.rollout``) does not:

1. **the tokens exactly as sampled**, turn after turn: the episode is kept as one id sequence
   (the first prompt, then every sampled turn and every observation between them), never
   re-rendered from parsed text (a call re-serialised by the template could tokenise
   differently from what the model wrote, and the log-probs would score tokens it never chose);
2. **a response mask**: 1 on the model's tokens, 0 on the prompt and on the tool observations
   (``<|im_start|>user <tool_response>...``), which are the environment's, not the policy's:
   the loss must not push the model to predict them;
3. **the outcome**: every call with its result and whether it was valid, and whether the last
   turn answered (``Trajectory``), for the reward (``training.agent_rl.agent_reward``).

``rollout_agent`` runs every episode of a batch together: each round, the rows still going
decode as one batch of prompts of different lengths (``model.generation.generate_many``), their
calls run through the course's safe executor (``tools.execute_tool``: arguments are data,
nothing the model writes is evaluated as code), and the observation ids are appended.

Tasks come from MiniMind's agent-RL records (``agent_rl.jsonl``, ``agent_rl_math.jsonl``:
``{"conversations": [...system with "tools", user, ..., a last message], "gt": [...]}``, the
last message dropped as MiniMind's ``AgentRLDataset`` does) or from the course's tool records
(``data/agent_rl.jsonl``, ``data/eval/tools_eval.jsonl``: ``answer`` is the exact reply).

>>> task = agent_task({"conversations": [{"role": "user", "content": "2+3?"},
...                                      {"role": "assistant", "content": ""}], "gt": [5]})
>>> task.messages, task.gt, task.answer
([{'role': 'user', 'content': '2+3?'}], ['5'], None)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from minimind_lib.data.readers import DataFormatError, gt_problem
from minimind_lib.evaluation.questions import reply
from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.model.generation import generate_many
from minimind_lib.tokenizer.bpe import BPETokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tokenizer.chat3 import normalise_messages
from minimind_lib.tokenizer.special import END_OF_TEXT, IM_END
from minimind_lib.tools.calls import parse_tool_calls
from minimind_lib.tools.registry import execute_tool

# --- 1. tasks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentTask:
    """One episode's start: the conversation before the first reply, the tools it offers,
    ``gt`` (what a right final answer contains, one tool result each; [] when it needs no
    tool) and ``answer`` (the exact final reply, when
    the record has one), and its kind (``tool_task``, else ``"agent"``)."""

    messages: list[dict]
    tools: list[dict]
    gt: list[str]
    answer: str | None = None
    kind: str = "agent"


def agent_task(record: dict, where: str = "record") -> AgentTask:
    """A record as an ``AgentTask``; anything malformed is a ``DataFormatError`` naming
    ``where`` (e.g. ``agent_rl.jsonl line 7``).

    MiniMind's format: ``conversations`` (its last message is the reply to be generated, and is
    dropped) and ``gt`` (a list; numbers allowed). The course's tool records have no ``gt``:
    their whole worked episode is there (call, result, answer), so the prompt is what comes
    before the first assistant turn (as ``evaluation.tool_use`` asks), and the final
    ``answer`` is the one thing to find.
    """
    turns = record.get("conversations")
    if not isinstance(turns, list) or len(turns) < 2:
        raise DataFormatError(f"{where}: 'conversations' must be a list of at least two messages "
                              "(the last one, the reply to be generated, is dropped)")
    if "gt" not in record:
        first = next((i for i, m in enumerate(turns)
                      if isinstance(m, dict) and m.get("role") == "assistant"), len(turns) - 1)
        turns = turns[:first + 1]
    try:
        messages, tools = normalise_messages(turns[:-1], "conversations")
    except ValueError as e:
        raise DataFormatError(f"{where}: {e}") from None
    answer = record.get("answer")
    gt = record.get("gt", [answer] if isinstance(answer, str) else None)
    if isinstance(gt, str | int | float) and not isinstance(gt, bool):
        gt = [gt]
    if not isinstance(gt, list) or not all(
            isinstance(g, str | int | float) and not isinstance(g, bool) for g in gt):
        raise DataFormatError(f"{where}: 'gt' must be a list of strings or numbers (what a "
                              f"right final answer contains; [] for a task needing no tool), "
                              f"got {gt!r:.80}")
    if gt_problem(gt):
        raise DataFormatError(f"{where}: {gt_problem(gt)}")
    plain = [{k: v for k, v in m.items() if k != "tools"} for m in messages]
    return AgentTask(plain, tools or [], [str(g) for g in gt],
                     answer if isinstance(answer, str) else None,
                     str(record.get("tool_task", "agent")))


# --- 2. episodes ----------------------------------------------------------------------------


@dataclass
class Trajectory:
    """One episode as token ids: ``prompt`` (the first prompt), then ``response``: every
    sampled turn (stop token included) and every observation after it, with ``mask`` 1 on the
    model's tokens and 0 on the observations; ``replies`` (each turn's text, markers kept),
    ``calls`` (``{"name", "arguments", "result", "valid"}``), ``errors`` (calls that could not
    be read) and whether the last turn ``answered`` (no call, closed by ``<|im_end|>``)."""

    prompt: list[int]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    answered: bool = False
    final: str = ""  # the answering turn's content ('' when it never answered)

    def labels(self) -> list[int]:
        """SFT-style labels of ``prompt + response``: the sampled ids where ``mask`` is 1,
        -100 on the prompt and the observations (what the policy loss scores).

        >>> Trajectory([5], [7, 8, 9], [1, 0, 1]).labels()
        [-100, 7, -100, 9]
        """
        return [IGNORE_INDEX] * len(self.prompt) + [t if m else IGNORE_INDEX
                                                    for t, m in zip(self.response, self.mask,
                                                                    strict=True)]

    def add(self, ids: Sequence[int], sampled: bool) -> None:
        self.response += list(ids)
        self.mask += [int(sampled)] * len(ids)


def observation_ids(tokenizer: BPETokenizer, results: Sequence[str],
                    open_thinking: bool = False) -> list[int]:
    """The ids that follow a sampled tool-calling turn (which ends with ``<|im_end|>``): the
    ``tool`` turn holding ``results`` and the next generation prompt, exactly as the chat
    template renders them after an assistant turn (the template renders each piece between two
    markers on its own, so these ids do not depend on what the turn said).

    >>> from minimind_lib.tokenizer.bpe import load_tokenizer
    >>> tok = load_tokenizer()
    >>> print(tok.decode(observation_ids(tok, ['{"result": "5"}'])))
    <BLANKLINE>
    <|im_start|>user
    <tool_response>
    {"result": "5"}
    </tool_response><|im_end|>
    <|im_start|>assistant
    <think>
    <BLANKLINE>
    </think>
    <BLANKLINE>
    <BLANKLINE>
    """
    turn = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]
    head = encode_chat(tokenizer, turn)
    cut = len(head) - head[::-1].index(tokenizer.token_to_id(IM_END))  # after its <|im_end|>
    full = encode_chat(tokenizer, turn + [{"role": "tool", "content": r} for r in results],
                       add_generation_prompt=True, open_thinking=open_thinking)
    if full[:cut] != head[:cut]:  # pragma: no cover - the template renders turns in order
        raise AssertionError("the chat template rendered an earlier turn differently")
    return full[cut:]


def run_calls(parsed_calls: Sequence[dict], errors: Sequence[str], offered: Sequence[dict],
              execute: Callable[[str, dict], str]) -> tuple[list[dict], list[str]]:
    """Run a turn's calls: ``(calls with "result" and "valid", the results to show)``. A call
    of a tool the task does not offer is answered with an error, not run; a call that could
    not be read is answered with its read error.

    >>> calls, shown = run_calls([{"name": "weekday", "arguments": {"date": "2026-04-01"}},
    ...                          {"name": "shell", "arguments": {}}], [], [], execute_tool)
    >>> [c["valid"] for c in calls], shown[0]
    ([False, False], '{"error": "weekday is not one of the offered tools (none)"}')
    """
    names = [t.get("function", t).get("name") for t in offered]
    out, shown = [], []
    for call in parsed_calls:
        if call["name"] in names:
            result = execute(call["name"], call["arguments"])
        else:
            result = json.dumps({"error": f"{call['name']:.40} is not one of the offered tools "
                                          f"({', '.join(names) or 'none'})"}, ensure_ascii=False)
        valid = call["name"] in names and "error" not in json.loads(result)
        out.append({**call, "result": result, "valid": valid})
        shown.append(result)
    shown += [json.dumps({"error": e}, ensure_ascii=False) for e in errors]
    return out, shown


@torch.no_grad()
def rollout_agent(model: nn.Module, tokenizer: BPETokenizer, tasks: Sequence[AgentTask], k: int,
                  *, max_rounds: int = 3, max_new_tokens: int = 96, temperature: float = 1.0,
                  seq_len: int | None = None, generator: torch.Generator | None = None,
                  max_rows: int = 256,
                  execute: Callable[[str, dict], str] = execute_tool) -> list[list[Trajectory]]:
    """``k`` episodes of each task (``temperature`` 0: greedy), ``[[Trajectory] * k]`` in task
    order. Each round, every episode still going writes one turn (all of them as one batch);
    a turn with calls gets their results and the episode goes on, up to ``max_rounds`` turns.
    An episode stops unanswered when a turn is cut by ``max_new_tokens``, when the last round
    still calls, or when the next turn would not fit ``seq_len`` (default: the model's context).
    """
    if k < 1 or max_rounds < 1 or max_new_tokens < 1:
        raise ValueError(f"k, max_rounds and max_new_tokens must be >= 1, got {k}, "
                         f"{max_rounds}, {max_new_tokens}")
    room = min(seq_len or model.config.max_position_embeddings,
               model.config.max_position_embeddings)
    stops = [tokenizer.token_to_id(IM_END), tokenizer.token_to_id(END_OF_TEXT)]
    prompts = [encode_chat(tokenizer, t.messages, True, tools=t.tools) for t in tasks]
    episodes = [Trajectory(list(p)) for p in prompts for _ in range(k)]
    going = [n for n, e in enumerate(episodes) if len(e.prompt) + max_new_tokens <= room]
    for turn in range(max_rounds):
        if not going:
            break
        turns = generate_many(model, [episodes[n].prompt + episodes[n].response for n in going],
                              max_new_tokens, eos_token_id=stops, batch_size=max_rows,
                              temperature=temperature, generator=generator)
        still = []
        for n, ids in zip(going, turns, strict=True):
            episode, task = episodes[n], tasks[n // k]
            kept, answer = reply(tokenizer, ids)
            episode.add(kept, sampled=True)
            episode.replies.append(answer.text)
            if not answer.ended:  # cut by the budget, or <|endoftext|>: the episode stops
                continue
            parsed = parse_tool_calls(answer.text)
            if not parsed.calls and not parsed.errors:
                episode.answered, episode.final = True, parsed.content
                continue
            calls, shown = run_calls(parsed.calls, parsed.errors, task.tools, execute)
            episode.calls += calls
            episode.errors += parsed.errors
            observation = observation_ids(tokenizer, shown)
            length = len(episode.prompt) + len(episode.response) + len(observation)
            if turn + 1 < max_rounds and length + max_new_tokens <= room:
                episode.add(observation, sampled=False)
                still.append(n)
        going = still
    return [episodes[i * k:(i + 1) * k] for i in range(len(tasks))]
