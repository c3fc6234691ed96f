"""The GGUF export run by llama.cpp itself (through llama-cpp-python): same tokens for the same
text; in f32 the same logits (1e-4), greedy tokens and chat answer (from the file's own chat
template); in f16 and q8_0 logits within the format's rounding along llama.cpp's greedy path.
Optional: llama-cpp-python compiles llama.cpp from source (``make llama-cpp``, about 10 minutes
on 2 cores), so this module skips where ``llama_cpp`` is not importable; tests/test_export.py
checks the file without it."""

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                                "(optional: `make llama-cpp` builds it)")

from minimind_lib.evaluation.questions import eval_files, load_eval_records, prompt_messages  # noqa: E402, E501
from minimind_lib.inference.chat import SamplingParams, complete, stop_ids  # noqa: E402
from minimind_lib.inference.export import export, load_gguf, write_gguf  # noqa: E402
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
from minimind_lib.model.checkpoint import load_model  # noqa: E402
from minimind_lib.tokenizer import encode_chat, load_tokenizer  # noqa: E402

TOK = load_tokenizer()
NEW_TOKENS = 32


@pytest.fixture
def open_gguf(monkeypatch):
    """Open a GGUF file in llama.cpp: one thread, an f32 KV cache (the default f16 cache would
    round keys and values: we compare f32 files to 1e-4), logits of every prompt position.

    subtle: llama.cpp's AMX kernels for q8_0 crash on CPUs that have AMX (its own q8_0
    files too; cf. ggml-org/llama.cpp#20824), so its extra CPU buffer types are switched off
    (``use_extra_bufts``, the ``--no-repack`` switch of its command line)."""
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def without_extra_buffers():
        params = defaults()
        params.use_extra_bufts = False
        return params

    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", without_extra_buffers)

    def open_(path):
        return llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=1, verbose=False,
                               logits_all=True, type_k=0, type_v=0)  # 0 = GGML_TYPE_F32
    return open_


def questions(n=4):
    return [prompt_messages(r) for r in load_eval_records()[::97][:n]]


def greedy_llama_cpp(llm, ids, n):
    """llama.cpp's logits for the prompt, then n greedy tokens (argmax of its own logits)."""
    llm.reset()
    llm.eval(ids)
    prompt_logits = np.array(llm.scores[:len(ids)])
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return prompt_logits, out


def test_llama_cpp_tokenizes_like_us(tmp_path, open_gguf):
    """The file's tokenizer (gpt2 BPE, gpt-2 pre-tokenizer) in llama.cpp == ours, on every
    held-out text and chat prompt, special tokens included."""
    llm = open_gguf(write_gguf(_random_model(), TOK, tmp_path / "m.gguf", "f16"))
    from minimind_lib.data import read_jsonl

    texts = [r["text"] for r in read_jsonl(eval_files("pretrain")[0], "pretrain")]
    texts += ["  leading spaces,\ttabs\n\n\nand   runs  ", "数字 12345 and émojis 🙂🙃"]
    for text in texts:
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == \
            TOK.encode(text, allowed_special=set()), text[:40]
    for messages in questions():
        chat = TOK.decode(encode_chat(TOK, messages, add_generation_prompt=True))
        assert llm.tokenize(chat.encode(), add_bos=False, special=True) == \
            encode_chat(TOK, messages, add_generation_prompt=True)


#: MiniMind-3's layout (QK-norm, a head wider than hidden / heads): llama.cpp's qwen3
MINIMIND3 = dict(qk_norm=True, intermediate_rule="pi", rms_norm_eps=1e-6, head_dim=32)


def _random_model(**overrides):
    """Untied head (the file then holds output.weight) and GQA; weights larger than at init so
    the logits are far apart and greedy choices never tie (norm weights moved off 1 too)."""
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(**{
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": False,
        **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
            else:
                p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.parametrize("which", ["smoke sft (tied)", "random (untied)",
                                   "random MiniMind-3 (qwen3)"])
def test_llama_cpp_logits_and_greedy_tokens_equal_ours_f32(smoke_runs, tmp_path, open_gguf, which):
    if which.startswith("smoke"):
        model, path = load_model(smoke_runs / "sft"), export(smoke_runs / "sft",
                                                             tmp_path / "m.gguf", "gguf", "f32")
    else:
        model = _random_model(**(MINIMIND3 if "qwen3" in which else {}))
        path = write_gguf(model, TOK, tmp_path / "m.gguf", "f32")
    llm = open_gguf(path)
    for messages in questions():
        ids = encode_chat(TOK, messages, add_generation_prompt=True)
        logits, tokens = greedy_llama_cpp(llm, ids, NEW_TOKENS)
        with torch.no_grad():
            ours = model(torch.tensor([ids])).logits[0].numpy()
        # two f32 implementations (measured ~1e-5 on logits of size ~10); 1e-4 leaves room for
        # summation order only, not for a wrong layout (which moves logits by whole units)
        assert np.abs(logits - ours).max() < 1e-4
        expected = model.generate(torch.tensor([ids]), NEW_TOKENS, temperature=0)
        assert tokens == expected[0, len(ids):].tolist()


@pytest.mark.parametrize("dtype,bound", [("f16", 0.02), ("q8_0", 0.2)])
def test_llama_cpp_greedy_path_in_f16_and_q8_0(smoke_runs, tmp_path, open_gguf, dtype, bound):
    """The same file's weights in our model (``load_gguf``) and in llama.cpp, along llama.cpp's
    own greedy path: every logit within ``bound`` of ours, so each token it picks is ours or
    one within 2 x bound of our best (a near-tie).

    Why not plain equality: llama.cpp also rounds activations (to 8 bits in a q8_0 matmul);
    measured on logits of ~8, f16 moves them by ~5e-3 and q8_0 by up to ~0.14. On the
    cpu-profile model greedy q8_0 answers then part from ours within 32 tokens on 5 of 8
    prompts, each time where our top two logits were within 0.016: a tie broken the other way.
    f32 has no such rounding, and test_llama_cpp_logits_and_greedy_tokens_equal_ours_f32
    asserts equal tokens."""
    path = export(smoke_runs / "sft", tmp_path / "m.gguf", "gguf", dtype)
    model, llm = load_gguf(path)[0], open_gguf(path)
    for messages in questions():
        ids = encode_chat(TOK, messages, add_generation_prompt=True)
        _, tokens = greedy_llama_cpp(llm, ids, NEW_TOKENS)
        theirs = np.array(llm.scores[:len(ids) + NEW_TOKENS - 1])  # every position it evaluated
        with torch.no_grad():  # ours, teacher-forced on llama.cpp's tokens
            ours = model(torch.tensor([ids + tokens[:-1]])).logits[0].numpy()
        assert np.abs(theirs - ours).max() < bound
        picked = ours[np.arange(len(ids) - 1, len(ours)), tokens]  # (NEW_TOKENS,)
        assert (ours[len(ids) - 1:].max(-1) - picked <= 2 * bound).all()


def test_llama_cpp_chat_uses_the_files_template_and_stop_token(smoke_runs, tmp_path, open_gguf):
    """llama-cpp-python's chat completion renders the prompt with the chat template stored in
    the file and stops at its end-of-turn token: the answer is our greedy answer."""
    llm = open_gguf(export(smoke_runs / "sft", tmp_path / "m.gguf", "gguf", "f32"))
    model = load_model(smoke_runs / "sft")
    for messages in questions():
        ids = encode_chat(TOK, messages, add_generation_prompt=True)
        ours = complete(model, TOK, ids, SamplingParams(NEW_TOKENS, temperature=0), stop_ids(TOK))
        theirs = llm.create_chat_completion(messages, temperature=0, max_tokens=NEW_TOKENS,
                                            repeat_penalty=1.0)["choices"][0]
        assert theirs["message"]["content"] == ours.text
        assert theirs["finish_reason"] == ours.finish_reason
