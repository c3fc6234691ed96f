"""Command line: ``python -m minimind_lib <command> [options]``.

Every stage registered in ``minimind_lib.stages`` is a subcommand taking the same options::

    python -m minimind_lib pretrain --profile cpu [--out DIR] [--resume]
    torchrun --nproc_per_node 2 -m minimind_lib pretrain --profile full   # DDP

A named stage always runs (its prerequisites only when missing); outputs go to
``<out>/<stage>/`` with ``<out>`` = ``runs/<profile>`` by default. Other commands (chat,
serve, export, all) go in ``COMMANDS``: a help line, a function adding their options, and a function
running them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from minimind_lib import pipeline
from minimind_lib.device import PRECISIONS
from minimind_lib.profiles import PROFILE_NAMES, get_profile
from minimind_lib.stages import STAGES, read_marker

#: extra subcommands: name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--profile and --out, shared by every command."""
    parser.add_argument("--profile", choices=PROFILE_NAMES, default=None,
                        help="smoke | cpu | full | auto (default: $MINIMIND_PROFILE, else auto)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="root of the stage folders (default: runs/<profile>)")


def add_stage_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the stage's latest checkpoint")
    parser.add_argument("--device", default=None, help="cuda | cuda:1 | mps | cpu (default: best)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="training precision (default: auto = bf16 where supported)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_stage(name: str, args: argparse.Namespace) -> int:
    out = pipeline.ensure(name, get_profile(args.profile), root=args.out, force=True,
                          resume=args.resume, device=args.device, precision=args.precision,
                          progress=not args.no_progress)
    print(f"{name}: done -> {out}")
    return 0


# --- talking to the model: chat and serve (minimind_lib.serve, notebook 08) -------------


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="a stage folder (default: the newest finished of dpo, sft, pretrain "
                             "under --out)")
    parser.add_argument("--device", default=None, help="cuda | mps | cpu (default: best)")


def chosen_model_dir(args: argparse.Namespace) -> str | Path:
    return args.model or pipeline.find_model_dir(args.out or get_profile(args.profile).runs_dir)


def model_card(model_dir: str | Path) -> dict:
    """Profile and stage of a stage folder (its ``stage.json``), for the served model card."""
    marker = read_marker(Path(model_dir)) or {}  # none: a folder not written by a stage
    card = {"profile": marker.get("fingerprint", {}).get("profile"), "stage": marker.get("stage")}
    return {k: v for k, v in card.items() if v is not None}


def load_chosen_model(args: argparse.Namespace):
    from minimind_lib.inference import load_for_serving

    model_dir = chosen_model_dir(args)
    model, tokenizer = load_for_serving(model_dir, args.device)
    print(f"model: {model_dir} ({model.num_parameters():,} parameters)", file=sys.stderr)
    return model, tokenizer


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--system", default=None, help="a system message")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)


def run_chat(args: argparse.Namespace) -> int:
    from minimind_lib.inference import ChatSession, SamplingParams, chat_loop

    params = SamplingParams(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    model, tokenizer = load_chosen_model(args)
    chat_loop(ChatSession(model, tokenizer, args.system, params))
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=None, help="TCP port (default 8998)")
    parser.add_argument("--name", default="minimind", help="the model id clients see")


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from minimind_lib import serve

    port = args.port or serve.DEFAULT_PORT
    model, tokenizer = load_chosen_model(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {args.host}: the server is reachable from other machines and "
              "has no authentication", file=sys.stderr)
    print(f"serving on http://{args.host}:{port} (the chat page at /; POST /generate, "
          "POST /v1/chat/completions, GET /v1/models)", file=sys.stderr)
    app = serve.create_app(model, tokenizer, model_name=args.name,
                           model_card=model_card(chosen_model_dir(args)))
    uvicorn.run(app, host=args.host, port=port, log_level="warning")
    return 0


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from minimind_lib.export import FORMATS, GGUF_DTYPES

    parser.add_argument("--format", choices=FORMATS, required=True,
                        help="gguf: one file for llama.cpp / Ollama; hf: a transformers folder")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="a model folder (a stage folder such as runs/cpu/dpo)")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="the .gguf file, or the Hugging Face folder, to write")
    parser.add_argument("--dtype", choices=GGUF_DTYPES, default=None,
                        help="gguf only: tensor type of the weights (default f16)")
    parser.add_argument("--name", default=None,
                        help="gguf only: the model name in the file (default minimind-<folder>)")


def run_export(args: argparse.Namespace) -> int:
    from minimind_lib.export import export

    try:
        path = export(args.model, args.out, args.format, dtype=args.dtype, name=args.name)
    except (FileNotFoundError, ValueError, ImportError) as e:  # user errors: no traceback
        print(f"export: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
    print(f"export: {args.model} -> {path} ({args.format}, {size / 1e6:.2f} MB)")
    return 0


def run_all(args: argparse.Namespace) -> int:
    """Every stage in order (finished, up-to-date ones are reused), then the report."""
    from minimind_lib.report import write_report

    profile = get_profile(args.profile)
    root = args.out or profile.runs_dir
    start = time.perf_counter()
    for stage in pipeline.stages_in_all():
        pipeline.ensure(stage.name, profile, root=root, resume=args.resume, device=args.device,
                        precision=args.precision, progress=not args.no_progress)
    wall = time.perf_counter() - start
    report = write_report(root, profile.name, wall_seconds=wall)
    print(f"all stages done in {wall / 60:.1f} min -> {report}")
    return 0


COMMANDS["all"] = (f"every stage ({', '.join(s.name for s in pipeline.stages_in_all())}), "
                   "then report.md", add_stage_arguments, run_all)
COMMANDS["chat"] = ("talk to the model in the terminal", add_chat_arguments, run_chat)
COMMANDS["serve"] = ("serve the model over HTTP (OpenAI-compatible)", add_serve_arguments,
                     run_serve)
COMMANDS["export"] = ("write a model folder as GGUF (llama.cpp, Ollama) or a Hugging Face folder",
                      add_export_arguments, run_export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minimind_lib",
                                     description="MiniMind from Scratch: run the course's stages.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for stage in STAGES.values():
        p = sub.add_parser(stage.name, help=stage.description)
        add_stage_arguments(p)
        p.set_defaults(func=partial(run_stage, stage.name))
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
