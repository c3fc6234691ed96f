"""Every notebook exercise can fail: each registered check (minimind_lib.exercises) rejects a
plausible wrong answer, and every exercise a notebook asks for has a check and a worked answer
in notebooks/solutions/ (which nbval runs, so the worked answers pass their checks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from minimind_lib import REPO_ROOT
from minimind_lib.dpo import answer_logprobs, dpo_loss
from minimind_lib.exercises import CHECKS, exercise

NOTEBOOKS = REPO_ROOT / "notebooks"
CALL = re.compile(r"""exercise\(\s*["'](\d\d\.\d+)["']""")

#: exercise id -> a plausible wrong answer (added with each exercise)
WRONG: dict[str, object] = {
    # notebook 06: the sign of eq. 8 flipped; the sum instead of the mean; >= counts ties;
    # the NLL summed over the answer instead of per token
    "06.1": lambda margin, beta, B: beta / B * torch.sigmoid(-margin),
    "06.2": lambda logits, labels: answer_logprobs(logits, labels),
    "06.3": lambda pol, ref: ((pol - ref)[:, 0] >= (pol - ref)[:, 1]).float().mean(),
    "06.4": lambda pi_w, pi_l, ref_w, ref_l, n_w, beta, alpha: (
        dpo_loss(pi_w, pi_l, ref_w, ref_l, beta)[0] - alpha * pi_w.mean()),
    # notebook 10: the mean of the whole group as baseline; k1 instead of k2; clipping
    # counted wherever the ratio leaves [1 - eps, 1 + eps], whatever the advantage's sign
    "10.1": lambda rewards: rewards - rewards.mean(dim=1, keepdim=True),
    "10.2": lambda logp, ref: logp - ref,
    "10.3": lambda ratio, adv, mask, eps: (((ratio - 1).abs() > eps) & mask).sum() / mask.sum(),
}


def _asked(notebook: Path) -> set[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return {m for c in cells if c["cell_type"] == "code" for m in CALL.findall("".join(c["source"]))}


def test_every_exercise_a_notebook_asks_for_has_a_check_a_wrong_answer_and_a_solution():
    for notebook in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        asked = _asked(notebook)
        assert asked <= set(CHECKS), f"{notebook.name}: no check for {sorted(asked - set(CHECKS))}"
        assert asked <= set(WRONG), f"{notebook.name}: no wrong answer for {sorted(asked - set(WRONG))}"
        if asked:
            solution = NOTEBOOKS / "solutions" / notebook.name
            assert solution.is_file(), f"{notebook.name} has exercises but no {solution}"
            assert _asked(solution) == asked, f"{solution.name} answers other exercises"


@pytest.mark.parametrize("exercise_id", sorted(WRONG))
def test_a_wrong_answer_fails_its_check(exercise_id):
    with pytest.raises(AssertionError):
        exercise(exercise_id, WRONG[exercise_id])


def test_a_stub_is_not_done_yet(capsys):
    def stub(*args):
        raise NotImplementedError("exercise")

    for exercise_id in CHECKS:
        assert exercise(exercise_id, stub) is False
    assert capsys.readouterr().out.count("not done yet") == len(CHECKS)
