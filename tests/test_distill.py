"""Knowledge distillation (``minimind_lib.training.distill``): the loss against its formula
written out and against ``F.kl_div``; the engine's loss on an SFT batch; black-box data."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from tiny import noisy, tiny_model

from minimind_lib import DATA_DIR
from minimind_lib.data.conversations import SFTDataset, pad_sft_batch
from minimind_lib.evaluation.questions import reply
from minimind_lib.model.checkpoint import load_model
from minimind_lib.model.decoder import IGNORE_INDEX
from minimind_lib.tokenizer import encode_chat, load_tokenizer
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR, copy_tokenizer_files
from minimind_lib.training.distill import DistillLoss, kd_loss, teacher_answers

TOK = load_tokenizer()
REFERENCE = DATA_DIR / "reference" / "sft"


def written_out(s: torch.Tensor, t: torch.Tensor, T: float) -> torch.Tensor:
    """T^2 * mean over positions of sum_v p_t(v) * (log p_t(v) - log p_s(v)), by hand."""
    total = torch.zeros((), dtype=torch.float64)
    for si, ti in zip(s.double(), t.double(), strict=True):
        p_t = torch.exp(ti / T) / torch.exp(ti / T).sum()
        p_s = torch.exp(si / T) / torch.exp(si / T).sum()
        total += (p_t * (p_t.log() - p_s.log())).sum()
    return T * T * total / len(s)


@pytest.mark.parametrize("T", [0.5, 1.0, 1.5, 4.0])
def test_kd_loss_is_the_written_out_kl_and_kl_div(T):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(7, 11, generator=g) * 3, torch.randn(7, 11, generator=g) * 3
    ours = kd_loss(s, t, T)
    assert ours.item() == pytest.approx(written_out(s, t, T).item(), rel=1e-5)
    library = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean")
    assert ours.item() == pytest.approx(T * T * library.item(), rel=1e-5)


def test_kd_loss_is_zero_at_the_teacher_and_positive_elsewhere_with_grads_to_the_student_only():
    t = torch.randn(4, 9)
    s = t.clone().requires_grad_(True)
    zero = kd_loss(s, t, 2.0)
    zero.backward()
    assert abs(zero.item()) < 1e-6 and s.grad.abs().max() < 1e-6  # the minimum
    s2, t2 = torch.randn(4, 9, requires_grad=True), torch.randn(4, 9, requires_grad=True)
    loss = kd_loss(s2, t2, 2.0)
    loss.backward()
    assert loss.item() > 0 and s2.grad.abs().sum() > 0 and t2.grad is None


def test_a_bigger_teacher_vocabulary_is_cut_to_the_students():
    s, t = torch.randn(3, 5), torch.randn(3, 8)
    assert kd_loss(s, t).item() == pytest.approx(kd_loss(s, t[:, :5]).item())
    with pytest.raises(ValueError, match="smaller than the student's"):
        kd_loss(t, s)
    with pytest.raises(ValueError, match="temperature"):
        kd_loss(s, t, 0.0)


def sft_batch():
    conversations = [[{"role": "user", "content": "3 + 5 = ?"},
                      {"role": "assistant", "content": "8"}],
                     [{"role": "user", "content": "你好"},
                      {"role": "assistant", "content": "你好！有什么可以帮你？"}]]
    data = SFTDataset([{"conversations": c} for c in conversations], TOK, 64, progress=False)
    return pad_sft_batch([data[i] for i in range(len(data))], 0)


def test_distill_loss_on_an_sft_batch_is_its_formula():
    student, teacher = tiny_model(0).train(), noisy(tiny_model(1))
    batch = sft_batch()
    loss_fn = DistillLoss(teacher, alpha=0.3, temperature=2.0)
    loss, metrics = loss_fn(student, batch)
    # the same numbers from the full logits, position by position
    targets = batch["labels"][:, 1:]
    scored = targets != IGNORE_INDEX
    s = student(batch["input_ids"]).logits[:, :-1][scored]
    with torch.no_grad():
        t = teacher(batch["input_ids"]).logits[:, :-1][scored]
    ce = F.cross_entropy(s, targets[scored])
    kd = written_out(s.detach(), t, 2.0)
    assert metrics["ce"].item() == pytest.approx(ce.item(), rel=1e-5)
    assert metrics["kd"].item() == pytest.approx(kd.item(), rel=1e-4)
    assert loss.item() == pytest.approx(0.3 * ce.item() + 0.7 * kd.item(), rel=1e-4)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())  # the teacher stays frozen
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())


def test_alpha_one_is_plain_sft_and_bad_settings_are_refused():
    student, teacher = tiny_model(0), noisy(tiny_model(1))
    batch = sft_batch()
    loss, metrics = DistillLoss(teacher, alpha=1.0)(student, batch)
    sft = student(batch["input_ids"], labels=batch["labels"]).loss
    assert loss.item() == pytest.approx(sft.item(), rel=1e-5) and "kd" not in metrics
    for bad in ({"alpha": 1.5}, {"alpha": -0.1}, {"temperature": 0.0}):
        with pytest.raises(ValueError):
            DistillLoss(teacher, **bad)


def test_teacher_answers_replace_the_last_reply_with_the_teachers_finished_one():
    teacher = load_model(REFERENCE).eval()  # the shipped chat model: it finishes its answers
    users = ["hi", "3 + 5 = ?", "你好", "Which word comes first in \"Dogs bark.\"?"]
    conversations = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": u},
                      {"role": "assistant", "content": "x"}] for u in users]
    kept = []
    for budget in (12, 2):
        got = teacher_answers(teacher, TOK, conversations, budget)
        expected = []
        for c in conversations:  # each conversation alone, through the model's own generate
            ids = torch.tensor([encode_chat(TOK, c[:2], add_generation_prompt=True)])
            new = teacher.generate(ids, budget, temperature=0)[0, ids.shape[1]:].tolist()
            _, answer = reply(TOK, new)
            if answer.follows_format:  # an answer cut by the budget is dropped
                expected.append(c[:2] + [{"role": "assistant", "content": answer.text}])
        assert got == expected
        kept.append(len(got))
    assert kept[0] == len(conversations) > kept[1]  # 2 tokens cut some answers short
    with pytest.raises(ValueError, match="assistant turn"):
        teacher_answers(teacher, TOK, [[{"role": "user", "content": "hi"}]], 4)


@pytest.mark.parametrize("mode", ["logits", "answers", "none"])
def test_distill_stage_trains_a_smaller_student_in_every_mode(tmp_path, capsys, mode):
    """`distill --init data/reference/sft` on a shrunken smoke profile: a student of the
    configured shape, metrics with the same validation in every mode (ce and kd logged when it
    learns from the logits), eval.json with the teacher and the student."""
    from dataclasses import replace

    from minimind_lib.course.profiles import get_profile
    from minimind_lib.course.stages import STAGES, StageContext

    smoke = get_profile("smoke")
    profile = replace(smoke, eval_per_task=2,
                      distill=replace(smoke.distill, max_steps=2, eval_every=2, save_every=2,
                                      warmup_steps=1, max_examples=24, mode=mode,
                                      answer_tokens=16))
    copy_tokenizer_files(COURSE_TOKENIZER_DIR, tmp_path / "tokenizer")
    ctx = StageContext("distill", profile, tmp_path, device="cpu", precision="fp32",
                       progress=False, init=REFERENCE)
    ctx.out_dir.mkdir()
    summary = STAGES["distill"].run(ctx)
    rows = [json.loads(line) for line in (ctx.out_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2] and "val_loss" in rows[-1]
    assert ({"ce", "kd"} <= set(rows[0])) == (mode == "logits")
    student = load_model(ctx.out_dir)
    assert (student.config.hidden_size, student.config.num_hidden_layers) == (128, 4)
    saved = json.loads((ctx.out_dir / "eval.json").read_text())
    assert set(saved["models"]) == {"teacher", "student"} and saved["mode"] == mode
    assert summary["student_parameters"] == student.num_parameters() < \
        saved["parameters"]["teacher"]
    assert "held-out questions" in capsys.readouterr().out


def test_distill_settings_are_checked():
    from minimind_lib.training.distill import DistillSettings

    for bad, words in (({"alpha": 2.0}, "alpha"), ({"mode": "soft"}, "mode"),
                       ({"student_hidden_size": 100, "student_heads": 3}, "multiple"),
                       ({"temperature": 0.0}, "temperature")):
        with pytest.raises(ValueError, match=words):
            DistillSettings(**bad)
