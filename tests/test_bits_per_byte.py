"""Bits per byte (minimind_lib.evaluation.perplexity.bits_per_byte): its definition computed by
hand, a closed form for a uniform model, batching and budgets, and the same number through
transformers (a Hugging Face model with its own tokenizer)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_model as shared_tiny_model

from minimind_lib.evaluation.perplexity import bits_per_byte, perplexity
from minimind_lib.model import MiniMindForCausalLM
from minimind_lib.model.hf import ByteLevelTokenizer, save_pretrained
from minimind_lib.tokenizer import load_tokenizer
from minimind_lib.tokenizer.bpe import COURSE_TOKENIZER_DIR

TOK = load_tokenizer()
TEXTS = ["The cat sat on the mat.", "床前明月光，疑是地上霜。举头望明月。", "x",
         "A third, longer line of text, with digits 12345 and <|im_end|> as plain text."]


def tiny_model(seed: int = 0, context: int = 64) -> MiniMindForCausalLM:
    """``tiny.tiny_model`` with two layers, an untied head and ``context`` positions."""
    return shared_tiny_model(seed, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=context,
                             tie_word_embeddings=False).eval()


def reference_bits_per_byte(model, texts, context):
    """The definition, one text at a time: NLL (nats) of tokens 2..n from log-softmax, bytes
    counted from the text itself (every byte but the first token's) when the text is not cut."""
    nll, n_bytes = 0.0, 0
    for text in texts:
        ids = TOK.encode(text, allowed_special=set())
        if len(ids) < 2:
            continue  # nothing to predict
        cut = ids[:context]
        with torch.no_grad():
            logp = F.log_softmax(model(torch.tensor([cut[:-1]])).logits[0].double(), -1)  # (T, V)
        nll -= logp[torch.arange(len(cut) - 1), torch.tensor(cut[1:])].sum().item()
        if len(ids) <= context:
            n_bytes += len(text.encode("utf-8")) - len(TOK.token_bytes(ids[0]))
        else:  # a cut text: ASCII in these tests, so its tokens decode to exact characters
            n_bytes += len(TOK.decode(cut[1:]).encode("utf-8"))
    return nll / (math.log(2) * n_bytes)


def test_bits_per_byte_is_its_definition():
    model = tiny_model(1)
    # fp32 logits summed in one cross_entropy vs a float64 reference: ~1e-6 relative
    expected = reference_bits_per_byte(model, TEXTS, context=64)
    assert bits_per_byte(model, TOK, TEXTS, batch_size=3) == pytest.approx(expected, rel=1e-5)


def test_texts_are_cut_to_the_context():
    model = tiny_model(2, context=64)
    long_text = "one two three four five six seven eight nine ten " * 20
    assert len(TOK.encode(long_text, allowed_special=set())) > 64
    for context in (5, 64):  # default: the model's max_position_embeddings
        expected = reference_bits_per_byte(model, [long_text, TEXTS[0]], context)
        got = bits_per_byte(model, TOK, [long_text, TEXTS[0]],
                            context=None if context == 64 else context)
        assert got == pytest.approx(expected, rel=1e-5)


def test_a_uniform_model_costs_log2_vocab_bits_per_token():
    """Zero logits: every token costs ln V nats, so bits/byte = log2(V) * tokens / bytes."""
    model = tiny_model(3)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    ids = [TOK.encode(t, allowed_special=set()) for t in TEXTS]
    tokens = sum(len(i) - 1 for i in ids if len(i) > 1)
    n_bytes = sum(len(t.encode()) - len(TOK.token_bytes(i[0]))
                  for t, i in zip(TEXTS, ids, strict=True) if len(i) > 1)
    expected = math.log2(model.config.vocab_size) * tokens / n_bytes
    assert bits_per_byte(model, TOK, TEXTS) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_batching_and_padding_do_not_change_it(batch_size):
    model = tiny_model(4)
    # padding to the longest text of a batch only changes float rounding: 1e-5 relative
    alone = bits_per_byte(model, TOK, TEXTS, batch_size=1)
    assert bits_per_byte(model, TOK, TEXTS, batch_size=batch_size) == pytest.approx(alone, rel=1e-5)


def test_max_tokens_keeps_the_first_texts_that_fit(tmp_path):
    model = tiny_model(5)
    first = TOK.encode(TEXTS[0], allowed_special=set())
    assert bits_per_byte(model, TOK, TEXTS, max_tokens=len(first) - 1) == pytest.approx(
        bits_per_byte(model, TOK, TEXTS[:1]), rel=1e-6)
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    assert bits_per_byte(model, TOK, path) == pytest.approx(bits_per_byte(model, TOK, TEXTS),
                                                            rel=1e-6)


def test_bad_arguments_are_named():
    model = tiny_model(6)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        bits_per_byte(model, TOK, ["x", ""])
    with pytest.raises(ValueError, match="context must be at least 2"):
        bits_per_byte(model, TOK, TEXTS, context=1)


def test_the_same_through_transformers_with_its_own_tokenizer(tmp_path):
    """A Hugging Face causal LM and AutoTokenizer, wrapped by hf.ByteLevelTokenizer, give our
    number: what lets any HF model be compared on the held-out text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_model(7)
    folder = save_pretrained(model, tmp_path / "hf", tokenizer_dir=COURSE_TOKENIZER_DIR)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                    dtype=torch.float32).eval()
    hf_tok = ByteLevelTokenizer(AutoTokenizer.from_pretrained(folder))
    ours = bits_per_byte(model, TOK, TEXTS)
    # two implementations of the same fp32 network (SDPA in both): 1e-5 relative
    assert bits_per_byte(hf_model, hf_tok, TEXTS) == pytest.approx(ours, rel=1e-5)


def test_bits_per_byte_and_perplexity_agree_on_one_window():
    """One text that fits one window: perplexity = 2 ** (bits/byte * bytes / tokens)."""
    model = tiny_model(8)
    text = TEXTS[1]
    ids = TOK.encode(text, allowed_special=set())
    n_bytes = len(text.encode()) - len(TOK.token_bytes(ids[0]))
    bpb = bits_per_byte(model, TOK, [text])
    # perplexity appends <|endoftext|> and predicts it too: compare on the same tokens by
    # giving it a window that stops before that last prediction
    ppl = perplexity(model, TOK, [text], seq_len=len(ids) - 1, max_tokens=len(ids))
    assert ppl == pytest.approx(2 ** (bpb * n_bytes / (len(ids) - 1)), rel=1e-5)
