"""Agentic RL: the multi-turn rollout (tokens kept as sampled, the response mask, observations
as the template renders them, limits), each reward term, CISPO against its formula written out,
the reading of MiniMind's agent-RL records, the bundled tasks, and a short run of the step."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny import tiny_model

from minimind_lib import DATA_DIR, REPO_ROOT
from minimind_lib.data.readers import DataFormatError, read_jsonl
from minimind_lib.model.checkpoint import load_model
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.tokenizer.chat import encode_chat
from minimind_lib.tools import tool_schemas
from minimind_lib.training import TrainConfig
from minimind_lib.training import agent_rollout as ar
from minimind_lib.training.agent_rl import (
    AgentRewardWeights,
    AgentSettings,
    agent_reward,
    agent_rollout,
    contains,
    reward_terms,
    solved,
    train_agent,
)
from minimind_lib.training.agent_rollout import (
    AgentTask,
    Trajectory,
    agent_task,
    observation_ids,
    rollout_agent,
)
from minimind_lib.training.grpo import cispo_objective, clipped_surrogate, grpo_loss
from minimind_lib.training.rollout import Question  # noqa: F401 (the single-turn sibling)

TOK = load_tokenizer()
END = TOK.token_to_id("<|im_end|>")
CALC = tool_schemas(["calculate"])
TASK = AgentTask([{"role": "user", "content": "What is 6 * 7?"}], CALC, ["42"], "6 * 7 = 42",
                 "calculate")
STUB = tiny_model(max_position_embeddings=4096)  # its config only: the scripts generate
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6 * 7"}}\n</tool_call>'


class Script:
    """``generate_many`` stand-in: each call answers every context with the next turn of its
    episode's script (episodes told apart by their first prompt and how many turns they have),
    records the contexts, and can leave a turn unended (no ``<|im_end|>``)."""

    def __init__(self, turns: list[str], ended: bool = True, task: AgentTask = TASK) -> None:
        self.turns, self.ended, self.contexts = turns, ended, []
        self.prompt_ends = encode_chat(TOK, task.messages, True, tools=task.tools).count(END)

    def __call__(self, model, prompts, max_new_tokens, **kw):
        self.contexts.append([list(p) for p in prompts])
        out = []
        for p in prompts:
            done = (p.count(END) - self.prompt_ends) // 2  # a turn and its observation: 2 ends
            ids = encode_text(self.turns[min(done, len(self.turns) - 1)])
            out.append(ids + ([END] if self.ended else []))
        return out


def encode_text(text: str) -> list[int]:
    """A reply's ids as the model writes them: markers as their special ids."""
    return TOK.encode(text, allowed_special="all")


def scripted(monkeypatch, turns, ended=True):
    script = Script(turns, ended)
    monkeypatch.setattr(ar, "generate_many", script)
    return script


# --- 1. rollouts ---------------------------------------------------------------------------


def test_observation_ids_are_what_the_template_renders_after_a_turn():
    results = ['{"result": "42"}', '{"error": "no"}']
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]
    rendered = encode_chat(TOK, convo + [{"role": "tool", "content": r} for r in results], True)
    head = encode_chat(TOK, convo)
    cut = len(head) - head[::-1].index(END)
    assert observation_ids(TOK, results) == rendered[cut:]
    thinking = observation_ids(TOK, results, open_thinking=True)
    assert TOK.decode(thinking).endswith("<think>\n")


def test_a_tool_episode_keeps_the_sampled_tokens_and_masks_the_observation(monkeypatch):
    script = scripted(monkeypatch, [CALL, "6 * 7 = 42"])
    (episode,), = rollout_agent(STUB, TOK, [TASK], 1, max_rounds=3, seq_len=4096)
    prompt = encode_chat(TOK, TASK.messages, True, tools=CALC)
    first = encode_text(CALL) + [END]
    observation = observation_ids(TOK, ['{"result": "42"}'])
    second = TOK.encode("6 * 7 = 42") + [END]
    assert episode.prompt == prompt
    assert episode.response == first + observation + second  # exactly as sampled, in order
    assert episode.mask == [1] * len(first) + [0] * len(observation) + [1] * len(second)
    labels = episode.labels()
    assert labels[:len(prompt)] == [-100] * len(prompt)
    assert [t for t in labels if t != -100] == first + second  # the model's tokens only
    assert script.contexts[1] == [prompt + first + observation]  # turn 2 reads turn 1 as sampled
    assert episode.answered and episode.final == "6 * 7 = 42"
    assert episode.calls == [{"name": "calculate", "arguments": {"expression": "6 * 7"},
                              "result": '{"result": "42"}', "valid": True}]
    assert solved(episode, TASK)


def test_an_episode_stops_unanswered_at_the_round_limit_the_budget_or_the_window(monkeypatch):
    scripted(monkeypatch, [CALL])  # calls every turn
    (episode,), = rollout_agent(STUB, TOK, [TASK], 1, max_rounds=2, seq_len=4096)
    assert len(episode.replies) == 2 and not episode.answered and len(episode.calls) == 2
    assert episode.mask[-1] == 1  # the last call's observation is not appended: nobody reads it
    scripted(monkeypatch, ["6 * 7 = 42"], ended=False)  # cut by max_new_tokens
    (episode,), = rollout_agent(STUB, TOK, [TASK], 1, max_rounds=3, seq_len=4096)
    assert not episode.answered and len(episode.replies) == 1
    prompt = len(encode_chat(TOK, TASK.messages, True, tools=CALC))
    scripted(monkeypatch, [CALL, "6 * 7 = 42"])  # no room for a second turn
    (episode,), = rollout_agent(STUB, TOK, [TASK], 1, max_new_tokens=96,
                                seq_len=prompt + 96 + 10)
    assert len(episode.replies) == 1 and not episode.answered


def test_calls_to_tools_not_offered_or_unreadable_are_answered_with_errors(monkeypatch):
    turns = ['<tool_call>\n{"name": "weekday", "arguments": {"date": "2026-04-01"}}\n'
             '</tool_call>', "<tool_call>{oops</tool_call>", "42"]
    scripted(monkeypatch, turns)
    (episode,), = rollout_agent(STUB, TOK, [TASK], 1, max_rounds=3, seq_len=4096)
    assert [c["valid"] for c in episode.calls] == [False]  # weekday was not offered
    assert "not one of the offered tools" in episode.calls[0]["result"]
    assert len(episode.errors) == 1 and episode.answered and episode.final == "42"
    terms = reward_terms(episode, TASK, AgentRewardWeights())
    assert terms["calls"] == pytest.approx(-0.5 * 3)  # none ran (1), one refused, one unread


def test_greedy_batched_episodes_equal_each_turn_generated_alone():
    """The real model: every sampled turn of a batched greedy episode is what ``generate``
    writes alone from the same context (the batch changes nothing), stop token included."""
    model = load_model(DATA_DIR / "reference" / "sft").float()
    tasks = [agent_task(r) for r in list(read_jsonl(DATA_DIR / "eval/tools_eval.jsonl", "sft"))
             if r["call"]][::60][:5]
    groups = rollout_agent(model, TOK, tasks, 1, temperature=0.0, max_new_tokens=64)
    assert any(e.calls for (e,) in groups)  # some episode went past one turn
    for (episode,) in groups:
        ids, mask = episode.prompt + episode.response, [0] * len(episode.prompt) + episode.mask
        k = len(episode.prompt)
        while k < len(ids):
            end = k
            while end < len(ids) and mask[end] == 1:
                end += 1
            alone = model.generate(torch.tensor([ids[:k]]), 64, temperature=0.0,
                                   eos_token_id=END)[0, k:].tolist()
            assert alone[:end - k] == ids[k:end]
            k = end
            while k < len(ids) and mask[k] == 0:
                k += 1


# --- 2. rewards ----------------------------------------------------------------------------


def test_contains_reads_numbers_as_numbers():
    assert contains("6 * 7 = 42.0", "42") and contains("1,234 km", "1234")
    assert not contains("420", "42") and not contains("x", "") and contains("Du Fu", "du fu")


@pytest.mark.parametrize("case, expected", [
    ("right with the tool's number", 1 + 1 + 0.5 + 0.5 + 0.5),  # + faithful: "6 * 7" copied
    ("right without a call", 1 + 1 - 0.5),  # one gt value: one call expected, none made
    ("wrong after a failed call", -0.5 * 2),  # gap: no call ran (1) + one failed (1)
    ("unbalanced and unfinished", -0.25 - 0.5 - 0.5),
])
def test_each_reward_term_and_its_weight(case, expected):
    good = {"name": "calculate", "arguments": {"expression": "6*7"}, "result": '{"result": "42"}',
            "valid": True}
    bad = {**good, "result": '{"error": "x"}', "valid": False}
    episodes = {
        "right with the tool's number": Trajectory([1], replies=[CALL, "6 * 7 = 42"],
                                                   calls=[good], answered=True,
                                                   final="6 * 7 = 42"),
        "right without a call": Trajectory([1], replies=["6 * 7 = 42"], answered=True,
                                           final="6 * 7 = 42"),
        "wrong after a failed call": Trajectory([1], replies=[CALL, "41"], calls=[bad],
                                                answered=True, final="41"),
        "unbalanced and unfinished": Trajectory([1], replies=["<tool_call>{"]),
    }
    assert agent_reward(episodes[case], TASK, AgentRewardWeights()) == pytest.approx(expected)


def test_faithful_arguments_are_copied_from_the_user_not_made_up():
    from minimind_lib.training.agent_rl import faithful

    task = AgentTask([{"role": "user", "content": "323 m 是多少 cm？从 2008-07-16 起"}], [], [])
    assert faithful({"value": 323, "from_unit": "m", "to_unit": "cm"}, task)
    assert faithful({"start": "2008-07-16"}, task) and faithful({"value": 323.0}, task)
    assert not faithful({"value": 32}, task) and not faithful({"start": "2008-07-15"}, task)
    assert not faithful({"x": ""}, task) and not faithful({"x": [1]}, task)


def test_weights_change_the_reward_and_the_gt_share_is_partial():
    task = AgentTask([], [], ["3", "4"])
    episode = Trajectory([1], replies=["3 and 5"], answered=True, final="3 and 5")
    assert reward_terms(episode, task, AgentRewardWeights())["answer"] == 0.5
    assert agent_reward(episode, task, AgentRewardWeights(answer=4.0, calls=0)) == 2.0
    assert not solved(episode, task)
    no_tool = AgentTask([], [], [])  # MiniMind's tasks that need no tool: gt []
    assert reward_terms(episode, no_tool, AgentRewardWeights())["calls"] == 0.5
    assert solved(episode, no_tool)


# --- 3. CISPO -------------------------------------------------------------------------------


def test_cispo_equals_its_formula_written_out():
    g = torch.Generator().manual_seed(0)
    logp = (torch.rand(3, 5, generator=g) * -3).double().requires_grad_()
    old = (logp.detach() + torch.randn(3, 5, generator=g).double())
    adv = torch.randn(3, generator=g).double()
    objective, clipped = cispo_objective(logp, old, adv, max_ratio=2.0)
    for b in range(3):
        for t in range(5):
            ratio = math.exp(logp[b, t].item() - old[b, t].item())
            weight = min(ratio, 2.0)
            assert objective[b, t].item() == pytest.approx(weight * adv[b].item()
                                                           * logp[b, t].item(), rel=1e-12)
            assert bool(clipped[b, t]) == (ratio > 2.0)
    objective.sum().backward()  # the weight is detached: d/dlogp = weight * A
    weight = torch.exp(logp.detach() - old).clamp(max=2.0)
    torch.testing.assert_close(logp.grad, weight * adv[:, None], rtol=1e-12, atol=0)


def test_cispo_keeps_a_gradient_where_the_clipped_surrogate_has_none():
    logp = torch.log(torch.tensor([[1.5]])).requires_grad_()  # ratio 1.5 > 1 + 0.2, A > 0
    objective, _ = clipped_surrogate(logp, torch.zeros(1, 1), torch.tensor([1.0]), 0.2)
    objective.sum().backward()
    assert logp.grad.item() == 0.0
    logp.grad = None
    objective, _ = cispo_objective(logp, torch.zeros(1, 1), torch.tensor([1.0]), 5.0)
    objective.sum().backward()
    assert logp.grad.item() == pytest.approx(1.5)


def test_on_policy_cispo_and_grpo_have_the_same_gradient():
    g = torch.Generator().manual_seed(1)
    logp = (torch.rand(4, 6, generator=g) * -2).requires_grad_()
    adv, mask = torch.randn(4, generator=g), torch.rand(4, 6, generator=g) > 0.3
    grads = []
    for loss in ("grpo", "cispo"):
        value, _ = grpo_loss(logp, logp.detach(), None, adv, mask, loss=loss)
        grads.append(torch.autograd.grad(value, logp)[0])
    torch.testing.assert_close(grads[0], grads[1])
    with pytest.raises(ValueError, match="choose one of grpo, cispo"):
        grpo_loss(logp, logp.detach(), None, adv, mask, loss="ppo")


# --- 4. records and settings ----------------------------------------------------------------


def test_minimind_records_drop_their_last_turn_and_bad_gt_is_named():
    record = {"conversations": [{"role": "system", "content": "", "tools": json.dumps(CALC)},
                                {"role": "user", "content": "6*7?"},
                                {"role": "assistant", "content": ""}], "gt": [42, "x"]}
    task = agent_task(record)
    assert [m["role"] for m in task.messages] == ["system", "user"] and task.gt == ["42", "x"]
    assert task.tools == CALC and task.answer is None
    with pytest.raises(DataFormatError, match=r"agent_rl.jsonl:7: 'gt' must be"):
        agent_task({**record, "gt": [True]}, "agent_rl.jsonl:7")
    with pytest.raises(DataFormatError, match="at least two messages"):
        agent_task({"conversations": [], "gt": [1]})


def test_the_course_records_prompt_before_the_worked_episode():
    held = next(r for r in read_jsonl(DATA_DIR / "eval/tools_eval.jsonl", "sft") if r["call"])
    task = agent_task(held)
    assert [m["role"] for m in task.messages] == ["system", "user"]
    assert task.answer == held["answer"] and task.gt == [held["answer"]]


def test_the_bundled_agent_tasks_are_the_scripts_output_and_unseen(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))
    import build_tool_data

    train, held = build_tool_data.build(DATA_DIR)
    bundled = list(read_jsonl(DATA_DIR / "agent_rl.jsonl", "agent_rl"))
    assert build_tool_data.build_agent_rl(train, held) == bundled
    question = build_tool_data._question_key
    assert not {question(r) for r in bundled} & {question(r) for r in train + held}
    for r in bundled:
        assert all(contains(r["answer"], g) for g in r["gt"])


def test_settings_are_checked():
    with pytest.raises(ValueError, match="AgentSettings.loss is 'ppo'"):
        AgentSettings(loss="ppo")
    with pytest.raises(ValueError, match="max_rounds must be positive"):
        AgentSettings(max_rounds=0)
    with pytest.raises(ValueError, match="cispo_max_ratio must be at least 1"):
        AgentSettings(cispo_max_ratio=0.5)


# --- 5. the step on the engine ----------------------------------------------------------------


@pytest.mark.parametrize("loss", ["grpo", "cispo"])
def test_train_agent_runs_and_logs_its_metrics(tmp_path, loss):
    tasks = [agent_task(r) for r in list(read_jsonl(DATA_DIR / "agent_rl.jsonl",
                                                    "agent_rl"))[:8]]
    settings = AgentSettings(batch_size=2, group_size=2, seq_len=256 * 3, max_new_tokens=8,
                             max_steps=2, warmup_steps=1, learning_rate=1e-3, loss=loss,
                             skip_flat_groups=False, save_every=2, max_rounds=2)
    model = tiny_model(max_position_embeddings=1024)
    config = TrainConfig.from_stage(settings, out_dir=tmp_path, precision="fp32",
                                    progress=False, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    rows = train_agent(model, TOK, tasks, settings, config, held_out=tasks[:2])
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward", "solved", "answered", "calls", "response_length", "kl", "loss",
                "val_solved"):
        assert all(math.isfinite(r[key]) for r in rows if key in r), key
    assert "val_solved" in rows[-1]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_agent_rollout_rewards_every_episode():
    model = tiny_model(max_position_embeddings=1024)
    settings = AgentSettings(batch_size=1, group_size=3, seq_len=1024, max_new_tokens=4)
    ro = agent_rollout(model, TOK, [TASK], settings, torch.Generator().manual_seed(0))
    assert ro.rewards.shape == (1, 3)
    for episode, r in zip(ro.groups[0], ro.rewards[0].tolist(), strict=True):
        assert r == pytest.approx(agent_reward(episode, TASK, settings.weights))
    stats = ro.stats()  # the logged terms add up to the logged reward
    assert sum(stats[f"reward_{name}"] for name in ro.terms) == pytest.approx(stats["reward"])


def test_the_stage_reads_minimind_agent_rl_files_and_names_a_bad_line(tmp_path, monkeypatch):
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stages_agent import agent_tasks

    mm_tools = [{"type": "function", "function": {"name": "calculate_math", "description": "x",
                                                  "parameters": {"type": "object", "properties": {
                                                      "expression": {"type": "string"}}}}}]
    line = {"conversations": [{"role": "system", "content": "", "tools": json.dumps(mm_tools)},
                              {"role": "user", "content": "3*7?"},
                              {"role": "assistant", "content": ""}], "gt": ["21"]}
    (tmp_path / "agent_rl.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n")
    monkeypatch.setenv("MINIMIND_DATA_DIR", str(tmp_path))
    tasks = agent_tasks(get_profile("smoke"))
    assert len(tasks) == 2 and tasks[0].kind == "agent" and tasks[0].gt == ["21"]
    assert tasks[0].tools[0]["function"]["name"] == "calculate_math"
    # a tool the course does not have is answered with an error, never run
    from minimind_lib.tools import execute_tool
    from minimind_lib.training.agent_rollout import run_calls
    calls, shown = run_calls([{"name": "calculate_math", "arguments": {"expression": "3*7"}}], [],
                             tasks[0].tools, execute_tool)
    assert not calls[0]["valid"] and "unknown tool" in shown[0]
    (tmp_path / "agent_rl.jsonl").write_text(json.dumps(line) + "\n" + json.dumps(
        {**line, "gt": {"a": 1}}) + "\n")
    with pytest.raises(DataFormatError, match=r"agent_rl.jsonl:2: field 'gt' must be a list"):
        agent_tasks(get_profile("smoke"))
