"""The training engine: LR schedule, accumulation, resume, NaN guard, precisions, DDP."""

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny import tiny_model as shared_tiny_model
from torch.utils.data import Dataset

from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.training import TrainConfig, train
from minimind_lib.training.loop import TrainingDiverged, default_loss
from minimind_lib.training.sampling import StepBatchSampler
from minimind_lib.training.settings import lr_at

VOCAB, T = 64, 16


class RandomTokens(Dataset):
    """Fixed random token windows (the engine does not care what the tokens mean)."""

    def __init__(self, n: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, VOCAB, (n, T + 1), generator=g)  # (N, T + 1)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def tiny_model(seed: int = 0, dropout: float = 0.0) -> MiniMindForCausalLM:
    """``tiny.tiny_model`` with two layers over the random-token vocabulary."""
    return shared_tiny_model(seed, vocab_size=VOCAB, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=64, dropout=dropout)


def config(**kw) -> TrainConfig:
    base = dict(batch_size=8, max_steps=6, warmup_steps=2, learning_rate=3e-3,
                precision="fp32", progress=False, seed=0, device="cpu")
    return TrainConfig(**{**base, **kw})


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- learning-rate schedule ------------------------------------------------------------


def test_lr_warmup_is_linear_then_cosine_to_min():
    kw = dict(max_steps=110, peak_lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, **kw) for s in range(110)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[4] == pytest.approx(5e-4)
    assert lrs[9] == pytest.approx(1e-3) and lrs[10] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4)  # 10% of the peak at the last step
    mid = 10 + 99 // 2  # halfway through the decay: cos(pi/2) = 0 -> mean of peak and min
    assert lr_at(mid, **kw) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 49 / 99)) * 9e-4)
    decay = lrs[10:]
    assert all(a >= b for a, b in zip(decay, decay[1:], strict=False))


def test_lr_without_warmup_starts_at_peak():
    assert lr_at(0, max_steps=5, peak_lr=2.0, warmup_steps=0, min_lr_ratio=0.0) == 2.0
    assert lr_at(4, max_steps=5, peak_lr=2.0, warmup_steps=0, min_lr_ratio=0.0) == pytest.approx(0)


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(max_steps=5, warmup_steps=-1)
    with pytest.raises(ValueError, match="precision is 'fp8'"):
        TrainConfig(precision="fp8")


# --- data order ------------------------------------------------------------------------


def test_sampler_covers_each_epoch_once_and_resumes_mid_stream():
    kw = dict(batch_size=2, accumulation_steps=2, world_size=1, rank=0, seed=3, max_steps=6)
    full = list(StepBatchSampler(10, start_step=0, **kw))  # 2 steps per epoch (8 of 10 used)
    epoch0 = sum(full[:4], [])
    assert len(set(epoch0)) == 8  # no example twice within an epoch
    assert list(StepBatchSampler(10, start_step=4, **kw)) == full[8:]  # step 4 onwards


def test_sampler_ranks_split_the_global_batch():
    kw = dict(batch_size=2, seed=1, start_step=0, max_steps=3)
    single = list(StepBatchSampler(12, accumulation_steps=2, world_size=1, rank=0, **kw))
    r0 = list(StepBatchSampler(12, accumulation_steps=1, world_size=2, rank=0, **kw))
    r1 = list(StepBatchSampler(12, accumulation_steps=1, world_size=2, rank=1, **kw))
    assert single[0::2] == r0 and single[1::2] == r1



def test_group_by_length_keeps_each_epoch_and_makes_steps_alike():
    lengths = [700 if i % 7 == 0 else 40 + i % 5 for i in range(2000)]  # 1 in 7 is long
    kw = dict(batch_size=16, accumulation_steps=1, world_size=1, rank=0, seed=5,
              start_step=0, max_steps=2000 // 16)
    plain = list(StepBatchSampler(2000, **kw))
    grouped = list(StepBatchSampler(2000, lengths=lengths, **kw))
    assert sorted(sum(grouped, [])) == sorted(sum(plain, []))  # the same examples, once each

    def padded(batches):
        return sum(16 * max(lengths[i] for i in b) for b in batches)
    assert padded(grouped) < 0.4 * padded(plain)  # most steps no longer pad to 700
    assert grouped != sorted(grouped, key=lambda b: lengths[b[0]])  # steps still shuffled
    assert list(StepBatchSampler(2000, lengths=lengths, **{**kw, "start_step": 40})) \
        == grouped[40:]  # resumable mid-epoch
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        StepBatchSampler(2000, lengths=[1, 2, 3], **kw)

def test_dataset_smaller_than_a_step_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one optimizer step"):
        train(tiny_model(), RandomTokens(n=4), config(batch_size=8))


# --- accumulation ----------------------------------------------------------------------


def test_accumulation_equals_one_big_batch():
    big_model, acc_model = tiny_model(), tiny_model()
    big = train(big_model, RandomTokens(), config(batch_size=8, max_steps=3))
    acc = train(acc_model, RandomTokens(), config(batch_size=2, accumulation_steps=4, max_steps=3))
    # fp32 sums of the same numbers in a different order: ~1e-7 relative. The grad norm is
    # the sharp check (Adam's update is scale invariant, so a missing "/ A" would show only
    # there: it would be 4x larger).
    for b, a in zip(big, acc, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for k, v in params(big_model).items():
        torch.testing.assert_close(params(acc_model)[k], v, rtol=1e-4, atol=1e-5)


# --- resume ----------------------------------------------------------------------------


class Interrupt(Exception):
    pass


def test_resume_is_bit_exact_on_cpu(tmp_path):
    # dropout > 0, so the restored RNG streams matter too
    whole = train(tiny_model(dropout=0.1), RandomTokens(),
                  config(max_steps=8, out_dir=tmp_path / "a", save_every=4))

    def kill_at_step_6(row):
        if row["step"] == 6:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(tiny_model(dropout=0.1), RandomTokens(),
              config(max_steps=8, out_dir=tmp_path / "b", save_every=4), callbacks=[kill_at_step_6])
    # a differently initialised model: everything must come from the checkpoint
    resumed = train(tiny_model(seed=123, dropout=0.1), RandomTokens(),
                    config(max_steps=8, out_dir=tmp_path / "b", save_every=4), resume=True)
    assert [r["step"] for r in resumed] == [5, 6, 7, 8]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in whole[4:]]  # exact
    assert [r["grad_norm"] for r in resumed] == [r["grad_norm"] for r in whole[4:]]
    from minimind_lib.course.plotting import read_metrics
    logged = read_metrics(tmp_path / "b")  # rows 5-6 of the killed run were dropped
    assert [r["loss"] for r in logged] == [r["loss"] for r in whole]


def test_resume_refuses_a_different_data_layout(tmp_path):
    train(tiny_model(), RandomTokens(), config(max_steps=2, out_dir=tmp_path, save_every=2))
    with pytest.raises(ValueError, match="batch_size was 8, now 4"):
        train(tiny_model(), RandomTokens(), config(max_steps=4, batch_size=4, out_dir=tmp_path),
              resume=True)


def test_resume_without_checkpoint_starts_fresh(tmp_path):
    rows = train(tiny_model(), RandomTokens(), config(max_steps=2, out_dir=tmp_path), resume=True)
    assert [r["step"] for r in rows] == [1, 2]


# --- NaN guard -------------------------------------------------------------------------


def nan_on(calls: set[int]):
    """A loss_fn returning NaN on the given (0-based) call numbers."""
    count = {"n": 0}

    def loss_fn(model, batch):
        loss, extra = default_loss(model, batch)
        n, count["n"] = count["n"], count["n"] + 1
        return (loss * float("nan") if n in calls else loss), extra

    return loss_fn


def test_a_nan_step_is_skipped_and_logged():
    model = tiny_model()
    before = params(model)
    rows = train(model, RandomTokens(), config(max_steps=1), loss_fn=nan_on({0}))
    assert rows[0].get("skipped") is True and math.isnan(rows[0]["loss"])
    for k, v in params(model).items():
        assert torch.equal(v, before[k]), f"{k} changed during a skipped step"
    rows = train(tiny_model(), RandomTokens(), config(max_steps=4), loss_fn=nan_on({1}))
    assert [r.get("skipped", False) for r in rows] == [False, True, False, False]
    assert all(math.isfinite(r["loss"]) for i, r in enumerate(rows) if i != 1)


def test_repeated_nan_stops_training_with_advice():
    with pytest.raises(TrainingDiverged, match=r"3 optimizer steps in a row.*learning rate.*bf16"):
        train(tiny_model(), RandomTokens(), config(max_steps=6, max_bad_steps=3),
              loss_fn=nan_on(set(range(100))))


# --- precisions ------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(precision, tmp_path):
    rows = train(tiny_model(), RandomTokens(), config(max_steps=3, precision=precision,
                                                      out_dir=tmp_path))
    assert all(math.isfinite(r["loss"]) for r in rows)
    state = torch.load(next((tmp_path / "checkpoints").glob("step_*")) / "train_state.pt",
                       weights_only=True)
    # a GradScaler only for fp16 (its state dict is empty when disabled)
    assert bool(state["scaler"]) == (precision == "fp16")


def test_metrics_rows_have_the_documented_fields():
    ds = RandomTokens()
    rows = train(tiny_model(), ds, config(max_steps=4, accumulation_steps=2, batch_size=4,
                                          eval_every=2, eval_batches=2), eval_dataset=ds)
    for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "tokens"):
        assert key in rows[0]
    assert [("val_loss" in r) for r in rows] == [False, True, False, True]
    assert rows[-1]["tokens"] == 4 * 2 * 4 * (T + 1)  # steps * A * B * tokens per row


# --- DDP -------------------------------------------------------------------------------


def _ddp_worker(rank: int, world_size: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=world_size)
    try:
        model = tiny_model()
        train(model, RandomTokens(), config(batch_size=4, max_steps=3))
        if rank == 0:
            torch.save(params(model), f"{tmp}/ddp.pt")
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_equal_one_process_accumulating(tmp_path):
    mp.spawn(_ddp_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    single = tiny_model()
    train(single, RandomTokens(), config(batch_size=4, accumulation_steps=2, max_steps=3))
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    # same examples per step (rank r = micro-batch r); the all-reduce averages in another
    # order than the local sum, so agreement is to fp32 rounding, amplified a little by 3
    # Adam steps: 1e-4 relative / 1e-5 absolute
    for k, v in params(single).items():
        torch.testing.assert_close(ddp[k], v, rtol=1e-4, atol=1e-5)
