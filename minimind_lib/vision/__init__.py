"""Vision (notebook 13): synthetic pictures, a tiny CLIP and a MiniMind-V style VLM.

* ``scenes``: pictures of coloured shapes with captions and questions that have exact answers;
* ``clip``: patches, the image and text encoders, the CLIP loss, zero-shot classification;
* ``vlm``: the projector, image slots in the prompt, ``VisionLanguageModel``, VLM folders;
* ``vqa``: question-answer training examples and exact-match scoring;
* ``pictures``: pictures to and from ``data:`` URLs (what the server receives);
* ``recipe``: ``VisionSettings`` and the vision stage's training and evaluation.

The contract's name, importable from here: ``clip_loss`` (``== transformers``' ``clip_loss``).
"""

from minimind_lib.vision.clip import clip_loss

__all__ = ["clip_loss"]
