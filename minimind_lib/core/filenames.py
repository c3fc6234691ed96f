"""Every file name a run folder holds, one definition each, so a reader (and ``grep``) finds
what a folder contains and who writes it.
"""

from __future__ import annotations

# --- a model folder (``checkpoint.save_model`` / ``load_model``) ---------------------------
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"  # the MiniMindConfig fields as one flat json object
QUANT_FILE = "quantization.json"  # present in int8 folders: the format and the int8 groups
TOKENIZER_FILE = "tokenizer.json"  # HF tokenizer.json
#: a tokenizer folder as transformers reads it (``BPETokenizer.save_pretrained``): the first two
#: are required, special_tokens_map.json travels along when present
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json")

# --- the vision stage's folders (``vision.clip.save_clip``, ``vlm.save_vlm``) ---------------------
CLIP_DIR = "clip"  # <out>/vision/clip/: the tiny CLIP (a CLIP folder)
VLM_DIR = "vlm"  # <out>/vision/vlm/: the vision-language model (a VLM folder)
CLIP_CONFIG_FILE = "clip_config.json"  # a CLIP folder: the CLIPConfig (+ model.safetensors)
VISION_FILE = "vision.safetensors"  # a VLM folder: image encoder + projector weights
VISION_CONFIG_FILE = "vision.json"  # a VLM folder: their config (+ the LM's own files)
# --- a LoRA adapter folder (``lora.save_adapter``: PEFT's file names) ------------------------
ADAPTER_CONFIG_FILE = "adapter_config.json"  # PEFT's LoraConfig fields
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"  # base_model.model.<module>.lora_A.weight ...
MERGED_DIR = "merged"  # the lora stage's merged model (a model folder)

# --- a training run (``training.loop.train``) -----------------------------------------------------
METRICS_FILE = "metrics.jsonl"  # one json object per optimizer step
CHECKPOINTS_DIR = "checkpoints"  # step_NNNNNNN/ folders and the ``latest`` pointer
LATEST_FILE = "latest"
STATE_FILE = "train_state.pt"  # optimizer, scaler, RNG, data position
PRETOKENIZED_META = "meta.json"  # beside train.bin / val.bin (``data.pretraining.tokenize_corpus``)

# --- a stage folder (``pipeline.ensure``) and the run report ---------------------------------
MARKER_FILE = "stage.json"  # written last: the stage finished, and from what
RUN_CONFIG_FILE = "run_config.json"  # written first: the fully resolved settings it runs with
EVAL_FILE = "eval.json"  # held-out scores of the models a stage compares
FORMATS_FILE = "formats.md"  # the quantize stage's format table
REPORT_FILE = "report.md"
FIGURES_DIR = "figures"
