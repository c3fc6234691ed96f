"""The vision path (notebook 13): synthetic scenes, the tiny CLIP, the MiniMind-V style VLM."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minimind_lib.core.filenames import VISION_CONFIG_FILE
from minimind_lib.model import MiniMindConfig, MiniMindForCausalLM
from minimind_lib.model.checkpoint import load_model
from minimind_lib.model.decoder import MiniMindModel
from minimind_lib.tokenizer import encode_chat, load_tokenizer
from minimind_lib.vision.clip import (
    CLIP,
    ZERO_SHOT_TARGETS,
    CLIPConfig,
    EncoderAttention,
    all_scenes,
    caption_ids,
    clip_loss,
    label,
    load_clip,
    patchify,
    save_clip,
    to_pixels,
    zero_shot,
)
from minimind_lib.vision.recipe import VisionSettings, train_vlm, vision_training
from minimind_lib.vision.scenes import (
    BACKGROUND,
    COLOURS,
    HELD_OUT_PAIRS,
    HUE_MARGIN,
    LANGUAGES,
    PLURAL,
    QUESTION_KINDS,
    SHAPES,
    UNNAMED_SHAPES,
    ZH,
    answers,
    caption,
    hue_distance,
    is_grey,
    make_scene,
    pairs,
    questions,
    render,
    training_scene,
)
from minimind_lib.vision.vlm import (
    IMAGE_TOKEN_ID,
    build_vlm,
    encode_image_chat,
    is_vlm_folder,
    load_vlm,
    save_vlm,
    splice,
)
from minimind_lib.vision.vqa import VQADataset, score_vqa, vqa_example

TINY_CLIP = CLIPConfig(vision_width=16, vision_layers=1, vision_heads=2, text_width=16,
                       text_layers=1, text_heads=2, embed_dim=8)
TINY_LM = MiniMindConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def tiny_vlm(seed: int = 0):
    torch.manual_seed(seed)
    return build_vlm(MiniMindForCausalLM(TINY_LM), CLIP(TINY_CLIP))


# --- scenes ----------------------------------------------------------------------------


def test_scenes_are_a_function_of_seed_split_and_index():
    a, b = make_scene(3, "train", 17), make_scene(3, "train", 17)
    assert a == b and np.array_equal(render(a), render(b))
    assert len({make_scene(3, "train", i) for i in range(50)}) == 50  # jitter: no repeats


def test_the_split_is_by_colour_shape_pair():
    train, held_out = set(pairs("train")), set(pairs("held_out"))
    assert held_out == set(HELD_OUT_PAIRS) and not train & held_out
    assert {c for c, _ in train} == set(COLOURS) and {s for _, s in train} == set(SHAPES)
    assert {c for c, _ in held_out} == set(COLOURS) and {s for _, s in held_out} == set(SHAPES)
    assert {make_scene(0, "held_out", i).pair for i in range(200)} == held_out
    assert {make_scene(0, "train", i).pair for i in range(400)} == train
    assert {make_scene(0, "seen", i).pair for i in range(400)} == train


def test_recoloured_scenes_show_no_palette_colour_and_name_none():
    for i in range(300):
        scene = make_scene(2, "recoloured", i)
        assert scene.colour == "" and scene.rgb is not None and max(scene.rgb) <= 200
        if not is_grey(scene.rgb):
            distances = {c: hue_distance(scene.rgb, c) for c in COLOURS}
            assert min(distances.values()) >= HUE_MARGIN, scene
            nearest = min(distances, key=distances.get)
            assert (nearest, scene.shape) not in HELD_OUT_PAIRS, scene  # never a reddish circle
        painted = ~(render(scene) == BACKGROUND).all(axis=-1)
        assert (render(scene)[painted] == scene.rgb).all()
        words = caption(scene, "en").split() + [caption(scene, "zh")]
        assert not any(c in words or ZH[c] in words[-1] for c in COLOURS), words
        assert [r["kind"] for r in questions(scene)].count("colour") == 0
        assert len(questions(scene)) == 8
    with pytest.raises(ValueError, match="no colour question"):
        from minimind_lib.vision.scenes import question
        question(make_scene(2, "recoloured", 0), "colour", "zh")
    assert {make_scene(2, "recoloured", i).shape for i in range(100)} == set(SHAPES)
    assert any(is_grey(make_scene(2, "recoloured", i).rgb) for i in range(100))


def test_reshaped_scenes_name_their_colour_and_no_shape():
    for i in range(100):
        scene = make_scene(2, "reshaped", i)
        assert scene.colour in COLOURS and scene.shape in UNNAMED_SHAPES and scene.rgb is None
        picture = render(scene)
        painted = ~(picture == BACKGROUND).all(axis=-1)
        assert (picture[painted] == COLOURS[scene.colour]).all() and painted.sum() > 10
        en, zh = caption(scene, "en"), caption(scene, "zh")
        assert scene.colour in en.split() and ZH[scene.colour] in zh
        assert not any(s in en or PLURAL[s] in en or ZH[s] in zh for s in SHAPES), (en, zh)
        asked = [r["kind"] for r in questions(scene)]
        assert "shape" not in asked and asked.count("colour") == 2 and len(asked) == 8
    assert {make_scene(2, "reshaped", i).shape for i in range(50)} == set(UNNAMED_SHAPES)
    with pytest.raises(ValueError, match="no shape question"):
        from minimind_lib.vision.scenes import question
        question(make_scene(2, "reshaped", 0), "shape", "en")
    # a ring is not a circle: the hole is background
    ring = render(replace(make_scene(2, "reshaped", 0), shape="ring", count=1, size="big"))
    disc = render(replace(make_scene(2, "reshaped", 0), shape="circle", count=1, size="big"))
    assert (ring != BACKGROUND).any(axis=-1).sum() < (disc != BACKGROUND).any(axis=-1).sum()


def test_pixels_are_normalised_by_the_training_pictures_own_statistics():
    from minimind_lib.vision.clip import PIXEL_MEAN, PIXEL_STD

    settings = VisionSettings()
    pictures = np.stack([render(training_scene(3, i, 2000, settings.recoloured, settings.reshaped))
                         for i in range(0, 2000, 2)])  # (1000, 64, 64, 3)
    x = to_pixels(pictures)  # (1000, 3, 64, 64)
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=0.05)
    assert torch.allclose(x.std(dim=(0, 2, 3)), torch.ones(3), atol=0.1)  # 2-5% apart by seed
    assert np.allclose(pictures.reshape(-1, 3).mean(0) / 255, PIXEL_MEAN, atol=0.005)
    assert np.allclose(pictures.reshape(-1, 3).std(0) / 255, PIXEL_STD, atol=0.01)


def test_the_encoders_positions_are_not_lost_beside_a_shape():
    """A patch with ink in it starts ~10x bigger than a background patch once pixels are
    normalised; positions at ViT's usual 0.02 were then ~1% of it and a smoke CLIP never
    learnt where the shapes are (zero-shot side 40%, chance 50%; 100% at the scale used)."""
    from minimind_lib.vision.clip import ImageEncoder

    torch.manual_seed(0)
    encoder = ImageEncoder(CLIPConfig(vocab_size=16, patch_size=16))
    pixels = to_pixels(np.stack([render(make_scene(0, "train", i)) for i in range(32)]))
    with torch.no_grad():
        patches = encoder.patch_embed(patchify(pixels, 16))  # (32, 16, 64)
    rms = patches.pow(2).mean(-1).sqrt()  # (32, 16)
    inked = rms > 2 * rms.median()  # most patches are background
    assert inked.float().mean() > 0.1
    position_rms = encoder.position.pow(2).mean(-1).sqrt()  # (16,)
    assert position_rms.mean() > 0.25 * rms[inked].mean()


def test_training_scenes_recolour_and_reshape_the_asked_shares():
    kinds = ["" == training_scene(0, i, 10, recoloured=0.3).colour for i in range(10)]
    assert kinds == [False] * 7 + [True] * 3
    assert training_scene(0, 4, 10) == make_scene(0, "train", 4)
    shapes = [training_scene(0, i, 10, 0.3, 0.2).shape in UNNAMED_SHAPES for i in range(10)]
    assert shapes == [False] * 5 + [True] * 2 + [False] * 3
    assert training_scene(0, 9, 10, 0.3, 0.2) == training_scene(0, 9, 10, 0.3)  # same recoloured
    with pytest.raises(ValueError, match="recoloured is a share"):
        training_scene(0, 0, 10, recoloured=1.0)
    with pytest.raises(ValueError, match="recoloured is a share"):
        VisionSettings(recoloured=-0.1)
    with pytest.raises(ValueError, match="reshaped is a share"):
        VisionSettings(reshaped=1.5)
    with pytest.raises(ValueError, match=r"recoloured \(0.6\) \+ reshaped \(0.5\)"):
        VisionSettings(recoloured=0.6, reshaped=0.5)


def test_vqa_training_data_asks_each_picture_only_what_it_shows():
    tokenizer = load_tokenizer()
    data = VQADataset(tokenizer, 10, seed=0, image_tokens=4, recoloured=0.3, reshaped=0.3)
    for k in range(len(data)):
        scene = data.scene(k // 10)
        answer = tokenizer.decode([t for t in data[k]["labels"]
                                   if t >= 0]).removesuffix("<|im_end|>")
        # a ring has no shape name, an unnamed ink no colour name: neither is ever asked
        kinds = [kind for kind in QUESTION_KINDS
                 if not (kind == "shape" and scene.shape in UNNAMED_SHAPES)
                 and not (kind == "colour" and not scene.colour)]
        assert any(answer in answers(kind, lang) for kind in kinds for lang in LANGUAGES), answer
    assert sum(data.scene(i).shape in UNNAMED_SHAPES for i in range(10)) == 3
    assert sum(data.scene(i).colour == "" for i in range(10)) == 3
    with pytest.raises(ValueError, match="for the training split"):
        VQADataset(tokenizer, 10, seed=0, image_tokens=4, split="held_out", recoloured=0.3)


def test_the_clip_sizes_nest_in_the_vision_settings_and_are_set_by_dotted_keys(tmp_path):
    from minimind_lib.course.profiles import get_profile, load_config, override, valid_keys

    smoke = get_profile("smoke")
    assert smoke.vision.clip_config(6400) == replace(smoke.vision.clip, vocab_size=6400)
    p = override(smoke, {"vision.clip.embed_dim": "16", "vision.vlm_training.max_steps": "5"})
    assert p.vision.clip.embed_dim == 16 and p.vision.vlm_training.max_steps == 5
    assert p.vision.clip.vision_width == smoke.vision.clip.vision_width  # the rest kept
    assert "vision.clip.patch_size" in valid_keys(smoke) and "vision.clip" not in valid_keys(smoke)
    with pytest.raises(ValueError, match="valid vision.clip keys: image_size, patch_size"):
        override(smoke, {"vision.clip.patch": "4"})
    with pytest.raises(ValueError, match="valid vision keys: .*recoloured"):
        override(smoke, {"vision.clip": "4"})
    with pytest.raises(ValueError, match="vision.clip.*multiple of patch_size"):
        override(smoke, {"vision.clip.patch_size": "7"})
    config = tmp_path / "c.toml"
    config.write_text("[vision.vlm_training]\nmax_steps = 7\n[vision.clip]\ntext_layers = 1\n"
                      "[model]\nrope_scaling = {type = 'yarn', factor = 4.0}\n")
    values = load_config(config)
    assert values["model.rope_scaling"] == {"type": "yarn", "factor": 4.0}  # a value, kept
    p = override(smoke, {k: v for k, v in values.items() if k.startswith("vision")})
    assert p.vision.clip.text_layers == 1 and p.vision.vlm_training.max_steps == 7
    assert p.overrides[-2:] == ("vision.vlm_training.max_steps=7", "vision.clip.text_layers=1")


def test_a_picture_holds_its_colour_on_its_side_only():
    for i in range(40):
        scene = make_scene(1, "train", i)
        image = render(scene)
        painted = ~(image == BACKGROUND).all(axis=-1)  # (H, W)
        assert (image[painted] == COLOURS[scene.colour]).all()
        columns = np.nonzero(painted.any(axis=0))[0]
        half = image.shape[1] // 2
        assert (columns < half).all() if scene.side == "left" else (columns >= half).all()
        blobs = _count_blobs(painted)
        assert blobs == scene.count, (scene, blobs)


def _count_blobs(mask: np.ndarray) -> int:
    """Connected painted regions (4-neighbourhood): one per shape when none touch."""
    seen, blobs = np.zeros_like(mask), 0
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        blobs += 1
        stack = [start]
        while stack:
            y, x = stack.pop()
            if 0 <= y < mask.shape[0] and 0 <= x < mask.shape[1] and mask[y, x] and not seen[y, x]:
                seen[y, x] = True
                stack += [(y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)]
    return blobs


def test_every_question_has_one_of_its_kinds_answers():
    scene = make_scene(0, "held_out", 5)
    records = questions(scene)
    assert len(records) == len(QUESTION_KINDS) * len(LANGUAGES)
    for r in records:
        assert r["answer"] in answers(r["kind"], r["language"])
    with pytest.raises(ValueError, match="unknown question kind 'mood'"):
        from minimind_lib.vision.scenes import question
        question(scene, "mood")


def test_every_caption_fits_the_text_encoder(tokenizer):
    for scene in all_scenes():
        for language in LANGUAGES:
            assert len(caption_ids(tokenizer, caption(scene, language), 32)) <= 32


# --- the tiny CLIP -------------------------------------------------------------------------


def test_clip_loss_equals_transformers():
    from transformers.models.clip import modeling_clip

    # transformers 5 renamed ``clip_loss`` to ``image_text_contrastive_loss`` (same body)
    hf_clip_loss = getattr(modeling_clip, "clip_loss", None) or \
        modeling_clip.image_text_contrastive_loss

    g = torch.Generator().manual_seed(0)
    for n in (1, 3, 16):
        similarity = torch.randn(n, n, generator=g) * 10
        # the same float32 cross-entropies summed the same way: equal to rounding (1e-6)
        torch.testing.assert_close(clip_loss(similarity), hf_clip_loss(similarity),
                                   rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="square"):
        clip_loss(torch.zeros(2, 3))


def test_clip_loss_is_symmetric_in_images_and_captions():
    s = torch.randn(5, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(clip_loss(s), clip_loss(s.T))
    one_way = F.cross_entropy(s, torch.arange(5))
    assert not torch.isclose(clip_loss(s), one_way)  # both directions count


def test_patch_embedding_is_a_strided_convolution():
    torch.manual_seed(0)
    pixels = torch.randn(2, 3, 48, 48)
    conv = torch.nn.Conv2d(3, 16, kernel_size=8, stride=8)
    linear = torch.nn.Linear(3 * 8 * 8, 16)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(16, -1))
        linear.bias.copy_(conv.bias)
    by_conv = conv(pixels).flatten(2).transpose(1, 2)  # (B, N, D)
    # the same 192 products per output, summed in another order: float32 rounding (1e-5)
    torch.testing.assert_close(linear(patchify(pixels, 8)), by_conv, rtol=0, atol=1e-5)


def test_encoder_attention_sees_every_patch():
    torch.manual_seed(0)
    config = TINY_CLIP.vision_block_config()
    attention = EncoderAttention(config)
    x = torch.randn(1, 6, config.hidden_size)
    y, _ = attention(x, None, None)
    q, k, v = attention._project(x, None, None)
    reference = F.scaled_dot_product_attention(q, k, v)  # no mask at all
    expected = attention.o_proj(reference.transpose(1, 2).reshape(1, 6, -1))
    torch.testing.assert_close(y, expected)
    manual = attention.weights(x, None, None)  # (1, H, T, T): the manual path's probabilities
    assert bool((manual[..., 0, 1:] > 0).all())  # the first patch reads the later ones
    x2 = x.clone()
    x2[0, -1] += 1.0
    assert not torch.allclose(attention(x2, None, None)[0][0, 0], y[0, 0])


def test_zero_shot_reads_the_class_off_the_captions(tokenizer, monkeypatch):
    """With one orthogonal text embedding per caption template, a picture embedded as its own
    caption is classified right for every target, and one embedded as another class's caption
    wrong: the bookkeeping from captions to classes holds."""
    from minimind_lib.vision import clip as vision

    templates = all_scenes()
    clip = CLIP(replace(TINY_CLIP, embed_dim=len(templates))).eval()
    monkeypatch.setattr(vision, "caption_embeddings", lambda *a, **k: torch.eye(len(templates)))
    scenes = [make_scene(0, "held_out", i) for i in range(12)]
    own = [next(k for k, t in enumerate(templates) if t.attributes() == s.attributes())
           for s in scenes]
    for target in ZERO_SHOT_TARGETS:
        classes = list(dict.fromkeys(label(t, target) for t in templates))
        right = torch.eye(len(templates))[own]
        assert zero_shot(clip, tokenizer, scenes, target, images=right) == (1.0, 1 / len(classes))
        other = [next(k for k, t in enumerate(templates) if label(t, target) != label(s, target))
                 for s in scenes]
        wrong = torch.eye(len(templates))[other]
        assert zero_shot(clip, tokenizer, scenes, target, images=wrong)[0] == 0.0
    with pytest.raises(ValueError, match="unknown zero-shot target 'mood'"):
        label(scenes[0], "mood")


def test_clip_folder_round_trip(tmp_path, tokenizer):
    clip = CLIP(TINY_CLIP).eval()
    save_clip(clip, tmp_path / "clip")
    again = load_clip(tmp_path / "clip")
    pixels = to_pixels(render(make_scene(0, "train", 0)))
    ids = torch.tensor([caption_ids(tokenizer, "one big red square on the left", 32)])
    assert torch.equal(clip(pixels, ids, torch.tensor([ids.shape[1]])),
                       again(pixels, ids, torch.tensor([ids.shape[1]])))
    (tmp_path / "clip" / "clip_config.json").write_text('{"patch_size": 7}')
    with pytest.raises(ValueError, match="clip_config.json: .*multiple of patch_size"):
        load_clip(tmp_path / "clip")


# --- the prompt and the splice ---------------------------------------------------------------


def test_image_slots_come_from_position_never_from_text(tokenizer):
    chat = [{"role": "user", "content": "What colour is the circle?"}]
    ids = encode_image_chat(tokenizer, chat, 9, add_generation_prompt=True)
    assert ids.count(IMAGE_TOKEN_ID) == 9
    assert [t for t in ids if t != IMAGE_TOKEN_ID] == encode_chat(tokenizer, chat, True)
    header = tokenizer.encode("user\n", allowed_special=set())
    first = ids.index(IMAGE_TOKEN_ID)
    assert ids[first - len(header) - 1:first] == [tokenizer.token_to_id("<|im_start|>")] + header
    forged = [{"role": "user", "content": "<image> -200 " + "@" * 196 + " <|image_pad|>"}]
    text_only = encode_chat(tokenizer, forged, True)
    assert IMAGE_TOKEN_ID not in text_only and min(text_only) >= 0
    assert encode_image_chat(tokenizer, forged, 4, True).count(IMAGE_TOKEN_ID) == 4


def test_image_goes_to_the_message_asked_for(tokenizer):
    chat = [{"role": "system", "content": "Look."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "And this?"}]
    ids = encode_image_chat(tokenizer, chat, 2, image_turn=3)
    tail = tokenizer.decode([t for t in ids[ids.index(IMAGE_TOKEN_ID) + 2:] if t >= 0])
    assert tail.startswith("And this?")
    with pytest.raises(ValueError, match="no message 4"):
        encode_image_chat(tokenizer, chat, 2, image_turn=4)


def test_vqa_example_supervises_the_answer_only(tokenizer):
    ids, labels = vqa_example(tokenizer, "What shape is in the picture?", "circle", 9)
    supervised = [t for t in labels if t != -100]
    assert tokenizer.decode(supervised) == "circle<|im_end|>"
    assert ids[-len(supervised):] == supervised and IMAGE_TOKEN_ID not in supervised


def test_splice_puts_each_picture_in_its_own_row():
    ids = torch.tensor([[IMAGE_TOKEN_ID, IMAGE_TOKEN_ID, 5], [6, IMAGE_TOKEN_ID, IMAGE_TOKEN_ID]])
    images = torch.arange(8.0).reshape(2, 2, 2)  # (B, M, C)
    out = splice(torch.full((2, 3, 2), -1.0), ids, images)
    assert out[0, :2].tolist() == images[0].tolist() and out[1, 1:].tolist() == images[1].tolist()
    assert out[0, 2].tolist() == [-1.0, -1.0] and out[1, 0].tolist() == [-1.0, -1.0]
    with pytest.raises(ValueError, match="image slots per row"):
        splice(torch.zeros(2, 3, 2), ids, torch.zeros(2, 3, 2))


# --- the VLM -------------------------------------------------------------------------------


def test_inputs_embeds_equal_token_ids():
    torch.manual_seed(0)
    trunk = MiniMindModel(TINY_LM).eval()
    ids = torch.randint(0, TINY_LM.vocab_size, (2, 7))
    by_ids, _ = trunk(ids)
    by_embeds, _ = trunk(None, inputs_embeds=trunk.embed_tokens(ids))
    assert torch.equal(by_ids, by_embeds)
    with pytest.raises(ValueError, match="inputs_embeds must be"):
        trunk(None, inputs_embeds=torch.zeros(2, 7))


def test_without_a_picture_the_vlm_is_its_lm():
    vlm = tiny_vlm().eval()
    ids = torch.randint(0, TINY_LM.vocab_size, (2, 9))
    assert torch.equal(vlm(ids).logits, vlm.lm(ids).logits)
    with pytest.raises(ValueError, match="need pixel_values"):
        vlm(torch.cat([ids, torch.full((2, 9), IMAGE_TOKEN_ID)], dim=1))


def _batch(tokenizer, vlm, n=4):
    data = VQADataset(tokenizer, 3, seed=0, image_tokens=vlm.image_tokens)
    return data.collate([data[k] for k in range(n)])


def test_answer_loss_equals_the_full_forward_loss(tokenizer):
    vlm = tiny_vlm().eval()
    batch = _batch(tokenizer, vlm)
    full = vlm(batch["input_ids"], batch["pixel_values"], labels=batch["labels"],
               return_logits=True).loss  # the plain path: all (B, T, V) logits
    fast = vlm.answer_loss(batch["input_ids"], batch["pixel_values"], batch["labels"])
    # the same logits at the supervised positions, averaged in another order: 1e-6
    torch.testing.assert_close(fast, full, rtol=0, atol=1e-6)


def test_the_picture_changes_the_answer_logits(tokenizer):
    vlm = tiny_vlm().eval()
    batch = _batch(tokenizer, vlm, n=1)
    other = torch.flip(batch["pixel_values"], dims=[-1])  # the mirror image: other side
    a = vlm(batch["input_ids"], batch["pixel_values"]).logits
    b = vlm(batch["input_ids"], other).logits
    first_slot = batch["input_ids"][0].tolist().index(IMAGE_TOKEN_ID)
    assert torch.equal(a[:, :first_slot], b[:, :first_slot])  # causal: before the picture
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_stream_with_a_picture_equals_recomputing_everything(tokenizer):
    vlm = tiny_vlm(seed=3).eval()
    batch = _batch(tokenizer, vlm, n=1)
    prompt = batch["input_ids"][:, :batch["labels"][0].ne(-100).nonzero()[0, 0]]  # up to the answer
    pixels = batch["pixel_values"]
    cached = torch.stack(list(vlm.stream(prompt, 6, temperature=0, pixel_values=pixels)), dim=1)
    seq = prompt
    for _ in range(6):  # greedy without a cache: the whole spliced sequence every step
        nxt = vlm(seq, pixels).logits[:, -1].argmax(dim=-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(cached, seq[:, prompt.shape[1]:])


def test_the_projector_tells_its_tokens_apart_by_position_and_adds_the_picture_token():
    """Four identical 2 x 2 blocks (a blank picture) give four different LM inputs (the
    per-token position vectors), then one more: the picture's CLIP embedding, whose scale does
    not matter (it is normalised), and which alone tells two pictures of equal patches apart."""
    from minimind_lib.vision.vlm import Projector

    torch.manual_seed(0)
    projector = Projector(vision_width=8, hidden_size=16, grid=4, embed_dim=6)
    assert projector.num_tokens == 5
    embedding = torch.randn(2, 6)
    out = projector(torch.ones(2, 16, 8), embedding)  # (2, 5, 16)
    assert out.shape == (2, 5, 16) and len({tuple(row.tolist()) for row in out[0, :4]}) == 4
    assert torch.allclose(out[0, :4] - projector.position, projector.mlp(torch.ones(1, 4, 32))[0])
    assert torch.equal(out[:, :4], out[[1, 0], :4])  # same patches, same patch tokens
    assert not torch.allclose(out[0, 4], out[1, 4])  # different pictures
    assert torch.allclose(projector(torch.ones(2, 16, 8), 7 * embedding), out, atol=1e-6)


def test_training_moves_the_projector_not_the_frozen_encoder(tokenizer):
    vlm = tiny_vlm()
    encoder_before = {k: v.clone() for k, v in vlm.encoder.state_dict().items()}
    projector_before = {k: v.clone() for k, v in vlm.projector.state_dict().items()}
    lm_before = {k: v.clone() for k, v in vlm.lm.state_dict().items()}
    settings = VisionSettings(train_images=4, clip_training=vision_training(4, 2e-3, 1, seq_len=32),
                              vlm_training=vision_training(4, 1e-3, 2, seq_len=64,
                                                           warmup_steps=1),
                              train_lm=False, clip=TINY_CLIP)
    rows = train_vlm(vlm, tokenizer, settings, seed=0, progress=False, precision="fp32")
    assert len(rows) == 2 and not vlm.encoder.training
    assert all(torch.equal(v, encoder_before[k]) for k, v in vlm.encoder.state_dict().items())
    assert all(torch.equal(v, lm_before[k]) for k, v in vlm.lm.state_dict().items())
    assert not all(torch.equal(v, projector_before[k])
                   for k, v in vlm.projector.state_dict().items())


def test_vlm_folder_round_trip(tmp_path, tokenizer):
    vlm = tiny_vlm().eval()
    folder = save_vlm(vlm, tmp_path / "vlm")
    assert is_vlm_folder(folder) and not is_vlm_folder(tmp_path)
    again = load_vlm(folder)
    batch = _batch(tokenizer, vlm, n=2)
    assert torch.equal(vlm(batch["input_ids"], batch["pixel_values"]).logits,
                       again(batch["input_ids"], batch["pixel_values"]).logits)
    ids = torch.randint(0, TINY_LM.vocab_size, (1, 5))
    assert torch.equal(load_model(folder)(ids).logits, vlm.lm(ids).logits)  # the LM part alone
    from minimind_lib.inference.loading import load_for_serving

    served, _ = load_for_serving(folder, "cpu")  # what `serve --model <vlm folder>` loads
    assert isinstance(served, type(vlm)) and served.image_tokens == vlm.image_tokens
    (folder / VISION_CONFIG_FILE).write_text(json.dumps({"merge": 2}))
    with pytest.raises(ValueError, match="vision.json: KeyError"):
        load_vlm(folder)


def test_the_oracle_features_mark_exactly_the_cells_with_shapes():
    """scripts/vision_oracle.py's ideal features: which 2x2 patch blocks hold ink."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "scripts" / "vision_oracle.py"
    spec = importlib.util.spec_from_file_location("vision_oracle", path)
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    encoder = oracle.InkEncoder(width=4, patch_size=8)
    for i in range(20):
        scene = make_scene(0, "held_out", i)
        ink = encoder.patch_features(to_pixels(render(scene)))[0, :, 0] > 0  # (64,)
        blocks = ink.reshape(4, 2, 4, 2).any(dim=3).any(dim=1)  # (4, 4): a cell per block
        assert {tuple(rc) for rc in blocks.nonzero().tolist()} == set(scene.cells)


def test_vqa_chance_is_one_over_the_possible_answers():
    scene = make_scene(0, "held_out", 0)
    records = [{**q, "scene": scene} for q in questions(scene)]
    from minimind_lib.evaluation.questions import Answer

    scores = score_vqa(records, [Answer(r["answer"], True) for r in records])
    assert scores["all"].exact_match == 1.0
    assert scores["colour"].chance == 1 / 5 and scores["shape/zh"].chance == 1 / 4
    assert scores["count"].chance == 1 / 3 and scores["side"].chance == 1 / 2
    assert scores["all"].chance == pytest.approx((1 / 5 + 1 / 4 + 1 / 3 + 1 / 2 + 1 / 2) / 5)


def test_vision_settings_check_their_fields():
    with pytest.raises(ValueError, match="TrainSettings.batch_size must be positive"):
        VisionSettings(clip_training=vision_training(0, 2e-3, 5, seq_len=32))
    with pytest.raises(ValueError, match="merge \\(3\\) must divide the patch grid \\(8"):
        VisionSettings(merge=3)
    with pytest.raises(ValueError, match="train_images \\(10\\) must be at least clip_training"):
        VisionSettings(train_images=10)


# --- serving pictures ---------------------------------------------------------------------


def _loud_vlm():
    """Large random weights: greedy answers differ from picture to picture, so a server that
    dropped or mixed up pictures would be caught."""
    vlm = tiny_vlm(seed=5).eval()
    with torch.no_grad():
        for p in [*vlm.lm.parameters(), *vlm.projector.parameters()]:
            if p.dim() == 2:
                p.normal_(0, 0.5)
    return vlm


def _picture_request(url, text="What colour is it?", **extra):
    return {"messages": [{"role": "user", "content": [
        {"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]}],
        "temperature": 0, "max_tokens": 6, **extra}


def test_the_server_reads_a_picture_in_openais_format(tokenizer):
    import httpx

    from minimind_lib.inference.chat import SamplingParams, TextStream
    from minimind_lib.inference.serve.app import create_app
    from minimind_lib.inference.serve.launch import BackgroundServer
    from minimind_lib.vision.pictures import data_url

    vlm = _loud_vlm()
    pictures = [render(make_scene(0, "held_out", i)) for i in range(3)]
    with BackgroundServer(create_app(vlm, tokenizer)) as server:
        got = [httpx.post(server.url + "/v1/chat/completions", timeout=60,
                          json=_picture_request(data_url(p))).json() for p in pictures]
        streamed = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                              json=_picture_request(data_url(pictures[0]), stream=True)).text
        text_only = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 4})
        link = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                          json=_picture_request("https://example.com/a.png"))
    prompt = encode_image_chat(tokenizer, [{"role": "user", "content": "What colour is it?"}],
                               vlm.image_tokens, add_generation_prompt=True)
    answers_ = [got_["choices"][0]["message"]["content"] for got_ in got]
    for picture, answer in zip(pictures, answers_, strict=True):
        direct = TextStream(vlm, tokenizer, prompt, SamplingParams(6, temperature=0),
                            pixel_values=to_pixels(picture))
        assert answer == "".join(direct)
    assert len(set(answers_)) > 1  # the picture matters
    chunks = [json.loads(line[6:]) for line in streamed.splitlines()
              if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == answers_[0]
    assert text_only.status_code == 200
    assert link.status_code == 400 and "data URL" in link.json()["error"]["message"]
    assert link.json()["error"]["param"] == "messages[0].content"


def test_a_text_model_refuses_pictures_and_says_why(tokenizer):
    import httpx

    from minimind_lib.inference.serve.app import create_app
    from minimind_lib.inference.serve.launch import BackgroundServer
    from minimind_lib.vision.pictures import data_url

    url = data_url(render(make_scene(0, "train", 0)))
    with BackgroundServer(create_app(MiniMindForCausalLM(TINY_LM).eval(), tokenizer)) as server:
        r = httpx.post(server.url + "/v1/chat/completions", json=_picture_request(url), timeout=60)
    assert r.status_code == 400 and "reads text only" in r.json()["error"]["message"]
    vlm_server = create_app(_loud_vlm(), tokenizer)
    two = _picture_request(url)
    two["messages"][0]["content"].append({"type": "image_url", "image_url": {"url": url}})
    with BackgroundServer(vlm_server) as server:
        r = httpx.post(server.url + "/v1/chat/completions", json=two, timeout=60)
        broken = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                            json=_picture_request("data:image/png;base64,aGVsbG8="))
    assert r.status_code == 400 and "2 pictures" in r.json()["error"]["message"]
    assert broken.status_code == 400 and "not a picture" in broken.json()["error"]["message"]


# --- the stage ------------------------------------------------------------------------------


def test_the_vision_stage_in_the_smoke_profile(smoke_runs, tmp_path):
    """`python -m minimind_lib vision --profile smoke` on the session's smoke sft model: the
    smoke CLIP settings as they are (its zero-shot figure must beat twice chance: measured
    72-88% against 5% over six seeds), a short VLM run on the tiny smoke LM (its figures are only
    checked to be there: 8 steps teach it nothing; docs/benchmarks.md has the full runs)."""
    import shutil

    from minimind_lib.__main__ import main
    from minimind_lib.core.filenames import EVAL_FILE, MARKER_FILE, METRICS_FILE
    from minimind_lib.course.profiles import get_profile
    from minimind_lib.vision.clip import load_clip

    root = tmp_path / "runs"
    shutil.copytree(smoke_runs, root)
    assert main(["vision", "--profile", "smoke", "--out", str(root), "--no-progress",
                 "--set", "vision.vlm_training.max_steps=8", "--set", "vision.eval_images=6"]) == 0
    out = root / "vision"
    result = json.loads((out / EVAL_FILE).read_text())
    assert result["zero_shot_chance"] == 1 / 20
    assert result["zero_shot_accuracy"] > 2 * result["zero_shot_chance"]
    assert 0 <= result["vqa_exact_match"] <= 1 and result["vqa"]["held_out"]["all"]["n"] == 60
    assert set(result["vqa_by_kind"]) == set(QUESTION_KINDS)
    phases = [json.loads(line)["phase"] for line in (out / METRICS_FILE).read_text().splitlines()]
    assert phases.count("clip") == get_profile("smoke").vision.clip_training.max_steps
    assert phases.count("vlm") == 8
    assert load_clip(out / "clip").config.vision_width == 64  # the smoke profile's CLIP
    vlm = load_vlm(out / "vlm")
    assert vlm.lm.config.hidden_size == 64  # the smoke sft model, with eyes
    assert (out / "vlm" / "tokenizer.json").is_file()
    summary = json.loads((out / MARKER_FILE).read_text())["summary"]
    assert summary["vqa_chance"] == result["vqa_chance"]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_the_server_reads_the_usual_picture_formats(fmt):
    import base64
    import io

    from PIL import Image

    from minimind_lib.vision.pictures import image_from_data_url

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, format=fmt)
    url = f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()
    assert image_from_data_url(url, 8).shape == (8, 8, 3)


@pytest.mark.parametrize("fmt", ["TIFF", "PPM", "ICO", "EPS"])
def test_other_picture_formats_are_refused_unread(fmt):
    """Issue 49: every Pillow format was accepted (an EPS goes to Ghostscript where it is
    installed). EPS is written by hand: Pillow writes it only with Ghostscript."""
    import base64
    import io

    from PIL import Image

    from minimind_lib.vision.pictures import image_from_data_url

    if fmt == "EPS":
        raw = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n%%EndComments\nshowpage\n"
    else:
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, format=fmt)
        raw = buf.getvalue()
    url = "data:image/x;base64," + base64.b64encode(raw).decode()
    with pytest.raises(ValueError, match="it reads PNG, JPEG, WEBP, GIF, BMP"):
        image_from_data_url(url, 8)
