"""Command line: ``python -m minimind_lib <command> [options]``.

Every stage registered in ``minimind_lib.course.stages`` is a subcommand taking the same options::

    python -m minimind_lib pretrain --profile cpu [--out DIR] [--resume]
        [--set pretrain.max_steps=3 ...] [--config FILE.toml]
    torchrun --nproc_per_node 2 -m minimind_lib pretrain --profile full   # DDP

A named stage always runs (its prerequisites only when missing); outputs go to
``<out>/<stage>/`` with ``<out>`` = ``runs/<profile>`` by default. Other commands (chat,
serve, export, all, plan, download, runs) go in ``COMMANDS``: a help line, a function adding
their options, and a function running them.

An error ends the command with one line on stderr and exit code 1 (Ctrl-C: 130); ``--debug``
(or ``MINIMIND_DEBUG=1``) shows the traceback instead. Cheap arguments (ports, the output
folder, sampling settings, ``--set`` keys, the data a profile needs) are checked before a model
or data is loaded.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from minimind_lib.core.device import PRECISIONS
from minimind_lib.course import pipeline
from minimind_lib.course.profiles import (
    PROFILE_NAMES,
    Profile,
    get_profile,
    load_config,
    override,
    parse_set,
)
from minimind_lib.course.stages import STAGES, read_marker

DEBUG_ENV = "MINIMIND_DEBUG"  # set to 1: errors show their traceback (as --debug does)

#: extra subcommands: name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                          Callable[[argparse.Namespace], int]]] = {}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--profile and --out, shared by every command."""
    parser.add_argument("--profile", choices=PROFILE_NAMES, default=None,
                        help="smoke | cpu | gpu | full | auto (default: $MINIMIND_PROFILE, "
                             "else auto: gpu with CUDA, else cpu)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="root of the stage folders (default: runs/<profile>)")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=f"show the traceback of an error (or set {DEBUG_ENV}=1)")


def check_out_dir(out: str | os.PathLike) -> None:
    """Fail now, before any work, when ``out`` cannot become a writable folder."""
    path = Path(out).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: no permission to write in {existing}")


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1-65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def batch_size(text: str) -> int:
    """argparse type: how many requests decode together, 1-1024."""
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a batch size (1-1024)")
    return int(text)


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="override one setting, e.g. pretrain.max_steps=3, "
                             "model.hidden_size=256, train.gradient_checkpointing=true "
                             "(repeatable)")
    parser.add_argument("--config", default=None, metavar="FILE.toml",
                        help="overrides from a TOML file ([pretrain] max_steps = 3); --set wins")


def chosen_profile(args: argparse.Namespace) -> Profile:
    """The profile of ``--profile`` with ``--config`` then ``--set`` applied (a bad key or
    value is an error naming it)."""
    profile = get_profile(args.profile)
    values = load_config(args.config) if getattr(args, "config", None) else {}
    values |= parse_set(getattr(args, "sets", []))
    return override(profile, values) if values else profile


def add_stage_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    add_override_arguments(parser)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the stage's latest checkpoint")
    parser.add_argument("--device", default=None, help="cuda | cuda:1 | mps | cpu (default: best)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="training precision (default: auto = bf16 where supported)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_init_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--init", default=None, metavar="MODEL_DIR",
                        help="start from this model folder instead of the previous stage's "
                             "(e.g. data/reference/sft: the shipped chat model)")


def run_stage(name: str, args: argparse.Namespace) -> int:
    profile = chosen_profile(args)
    check_out_dir(args.out or profile.runs_dir)
    pipeline.check_data([name], profile)
    out = pipeline.ensure(name, profile, root=args.out, force=True,
                          resume=args.resume, device=args.device, precision=args.precision,
                          progress=not args.no_progress, init=getattr(args, "init", None))
    print(f"{name}: done -> {out}")
    return 0


# --- talking to the model: chat and serve (minimind_lib.inference.serve, notebook 08) -------------


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
    from minimind_lib.inference.loading import load_for_serving

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
    parser.add_argument("--tools", action="store_true",
                        help="offer the course's tools (calculator, units, dates, poem authors)")
    parser.add_argument("--think", action="store_true", help="thinking on (MiniMind-3's format)")


def run_chat(args: argparse.Namespace) -> int:
    from minimind_lib.inference.chat import (
        ChatSession,
        SamplingError,
        SamplingParams,
        chat_loop,
        tool_chat_loop,
    )
    from minimind_lib.tokenizer.chat import template_of

    try:
        params = SamplingParams(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    except SamplingError as e:
        raise ValueError(f"--{e.field.replace('_', '-')}: {e}") from None
    model, tokenizer = load_chosen_model(args)
    if args.tools or args.think:
        if not hasattr(model, "generate"):  # a vision-language model: its own chat, no tools
            raise ValueError("--tools and --think are for text models: "
                             f"{chosen_model_dir(args)} holds a vision-language model, whose chat "
                             "template has no tools and no thinking; chat without them")
        if template_of(tokenizer) != "minimind-3":
            raise ValueError("--tools and --think need a model in MiniMind-3's chat format (its "
                             "tokenizer reserves the tool and thinking markers); this one speaks "
                             "MiniMind2's")
        tool_chat_loop(model, tokenizer, tools=args.tools, think=args.think, system=args.system,
                       max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        return 0
    chat_loop(ChatSession(model, tokenizer, args.system, params))
    return 0


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=port_number, default=None,
                        help="TCP port (default 8998)")
    parser.add_argument("--name", default="minimind", help="the model id clients see")
    parser.add_argument("--max-batch", type=batch_size, default=None, metavar="N",
                        help="requests that decode together (continuous batching; default "
                             "32; 1: one after another)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the decoder (the first requests wait while it "
                             "compiles; measured slower on a CPU, see docs/benchmarks.md)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' (default: $MINIMIND_API_KEY, "
                             "which keeps the key out of the process list; recommended "
                             "whenever --host is not this machine)")


def check_can_listen(host: str, port: int) -> None:
    """Fail now, before the model loads, when ``host:port`` cannot be bound."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            s.bind((host, port))
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from minimind_lib.inference.serve.app import LOOPBACK_HOSTS, check_api_key, create_app
    from minimind_lib.inference.serve.launch import API_KEY_ENV, DEFAULT_PORT, uvicorn_config

    port = args.port or DEFAULT_PORT
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key is empty: give a key, or leave the option out to serve "
                         f"without one (or set {API_KEY_ENV})")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_api_key(api_key)  # before the model loads: a key no client can send is refused now
    check_can_listen(args.host, port)
    model, tokenizer = load_chosen_model(args)
    if args.compile:
        from minimind_lib.model.generation import compile_decoder

        compile_decoder(model)
    loopback = args.host in LOOPBACK_HOSTS
    if not loopback and api_key is None:
        print(f"warning: binding {args.host}: the server is reachable from other machines and "
              f"has no API key (set --api-key or {API_KEY_ENV})", file=sys.stderr)
    print(f"serving on http://{args.host}:{port} (the chat page at /; POST /generate, "
          "POST /v1/chat/completions, GET /v1/models)"
          + (", API key required" if api_key else ""), file=sys.stderr)
    batching = {} if args.max_batch is None else {"max_batch": args.max_batch}
    app = create_app(model, tokenizer, model_name=args.name, api_key=api_key, **batching,
                     model_card=model_card(chosen_model_dir(args)),
                     allowed_hosts=LOOPBACK_HOSTS if loopback and api_key is None else None)
    uvicorn.Server(uvicorn_config(app, args.host, port)).run()
    return 0


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    from minimind_lib.inference.export import FORMATS, GGUF_DTYPES

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
    from minimind_lib.inference.export import export

    path = export(args.model, args.out, args.format, dtype=args.dtype, name=args.name)
    size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
    print(f"export: {args.model} -> {path} ({args.format}, {size / 1e6:.2f} MB)")
    return 0


def run_all(args: argparse.Namespace) -> int:
    """Every stage in order (finished, up-to-date ones are reused), then the report."""
    from minimind_lib.course.report import write_report

    profile = chosen_profile(args)
    pipeline.check_data([s.name for s in pipeline.stages_in_all()], profile)
    root = args.out or profile.runs_dir
    check_out_dir(root)
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


# --- before and around training: plan, download --------------------------------------------


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    add_override_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--no-cpu-probe", action="store_true",
                        help="skip timing two training steps on this CPU")


def run_plan(args: argparse.Namespace) -> int:
    import json

    from minimind_lib.course.plan import PLANNED_STAGES, format_plan, plan

    profile = chosen_profile(args)
    pipeline.check_data(list(PLANNED_STAGES), profile)
    result = plan(profile, cpu_probe=not args.no_cpu_probe)
    print(json.dumps(result, indent=2) if args.json else format_plan(result))
    return 0


def add_download_arguments(parser: argparse.ArgumentParser) -> None:
    from minimind_lib.core.download import DATA_FILE_SETS, MODELS

    parser.add_argument("what", choices=("data", "model", "bench"),
                        help="data: MiniMind's jsonl datasets (--files); model: a released "
                             "model as a transformers folder (--name); bench: the datasets of "
                             "lm-eval tasks (--tasks) into the Hugging Face cache")
    parser.add_argument("--files", nargs="+", default=None, metavar="SET|NAME",
                        help=f"data: a set ({', '.join(DATA_FILE_SETS)}; default mini = "
                             "pretrain_t2t_mini, sft_t2t_mini, dpo, rlaif) or file names")
    parser.add_argument("--name", default=None, choices=list(MODELS),
                        help="model: which one (default MiniMind2-Small)")
    parser.add_argument("--to", default=None, metavar="DIR",
                        help="target folder (default: $MINIMIND_DATA_DIR or data/minimind/ for "
                             "data, data/minimind/<name> for a model)")
    parser.add_argument("--source", choices=("huggingface", "modelscope"), default="huggingface")
    parser.add_argument("--repo", default=None, help="another repo id to fetch the same way")
    parser.add_argument("--tasks", type=task_list, default=None, metavar="T1,T2",
                        help=f"bench: lm-eval task names (default {BENCH_TASKS})")
    parser.add_argument("--include_path", default=None, metavar="DIR",
                        help="bench: a folder of local lm-eval YAML tasks")


def run_download(args: argparse.Namespace) -> int:
    from minimind_lib.core.download import download

    if args.files and args.what != "data" or args.name and args.what != "model":
        raise ValueError("--files goes with `download data`, --name with `download model`")
    if (args.tasks or args.include_path) and args.what != "bench":
        raise ValueError("--tasks and --include_path go with `download bench`")
    if args.what == "bench":
        tasks = args.tasks or task_list(BENCH_TASKS)
        harness_module().fetch_tasks(tasks, include_path=args.include_path)
        print(f"done: the datasets of {', '.join(tasks)} are in the Hugging Face cache; run "
              "`python -m minimind_lib bench --model DIR` (offline)")
        return 0
    folder = download(args.what, args.to, source=args.source, repo_id=args.repo,
                      files=args.files, model=args.name)
    if args.what == "data":
        print(f"done: use it with MINIMIND_DATA_DIR={folder} (the full profile looks in "
              "data/minimind/ by default)")
    else:
        print(f"done: load it with minimind_lib.model.hf.load_pretrained({str(folder)!r})")
    return 0


def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--clean", action="store_true",
                        help=f"delete the kept previous runs (<out>/{pipeline.PREVIOUS_DIR}/)")


def run_runs(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from minimind_lib.core.device import human_bytes

    root = Path(args.out) if args.out else chosen_profile(args).runs_dir
    rows = pipeline.list_runs(root)
    if not rows:
        print(f"{root}: no stage folders yet")
        return 0
    print(f"{root}:")
    for r in rows:
        where = "kept " if r["kept"] else ""
        print(f"  {where}{r['name']:<22} {r['status']:<10} run {(r['run_id'] or '-')[:8]:<8} "
              f"{r['finished_at'] or '':<19}  {human_bytes(r['bytes']):>9}")
    kept = [r for r in rows if r["kept"]]
    previous = root / pipeline.PREVIOUS_DIR
    if kept and args.clean:
        shutil.rmtree(previous)
        print(f"deleted {len(kept)} kept run(s), {human_bytes(sum(r['bytes'] for r in kept))}")
    elif kept:
        print(f"{len(kept)} kept previous run(s) use {human_bytes(sum(r['bytes'] for r in kept))}; "
              f"remove them with `python -m minimind_lib runs --out {root} --clean` "
              f"(or rm -rf {previous})")
    return 0


# --- bench: lm-evaluation-harness tasks ------------------------------------------------------

#: what MiniMind reports (its README's lm-eval table), the default of ``bench``
BENCH_TASKS = "ceval-valid,cmmlu,arc_easy,piqa,openbookqa,hellaswag,social_iqa"


def task_list(text: str) -> list[str]:
    """argparse type: comma-separated lm-eval task names."""
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    if not tasks:
        raise argparse.ArgumentTypeError(f"{text!r}: no task names")
    return tasks


def harness_module():
    """``inference.harness``, or a clear error when lm-eval is not installed."""
    try:
        from minimind_lib.inference import harness
    except ImportError as e:
        raise ValueError(f"bench needs lm-evaluation-harness ({e}): pip install -e '.[eval]' "
                         "(or `make eval-harness`)") from None
    return harness


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR|FILE",
                        help="a stage folder, a transformers folder or a MiniMind .pth")
    parser.add_argument("--tasks", type=task_list, default=task_list(BENCH_TASKS),
                        metavar="T1,T2", help=f"lm-eval task names (default {BENCH_TASKS})")
    parser.add_argument("--include_path", default=None, metavar="DIR",
                        help="a folder of local lm-eval YAML tasks")
    parser.add_argument("--limit", type=int, default=None, help="at most N examples per task")
    parser.add_argument("--num_fewshot", type=int, default=None)
    parser.add_argument("--apply_chat_template", action="store_true",
                        help="contexts through the model's chat template (as MiniMind runs it)")
    parser.add_argument("--batch-size", type=batch_size, default=32)
    parser.add_argument("--device", default=None, help="cuda | mps | cpu (default: best)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run_bench(args: argparse.Namespace) -> int:
    if not Path(args.model).exists():
        raise FileNotFoundError(f"--model {args.model}: no such folder or file")
    if args.include_path and not Path(args.include_path).is_dir():
        raise FileNotFoundError(f"--include_path {args.include_path}: no such folder")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be positive, got {args.limit}")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ValueError(f"--num_fewshot must be 0 or more, got {args.num_fewshot}")
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # nothing downloads implicitly
        os.environ.setdefault(flag, "1")
    harness = harness_module()
    try:
        print(harness.bench(args.model, args.tasks, include_path=args.include_path,
                            limit=args.limit, batch_size=args.batch_size, device=args.device,
                            apply_chat_template=args.apply_chat_template,
                            num_fewshot=args.num_fewshot, as_json=args.json))
    except ConnectionError as e:
        raise ValueError(f"a task's dataset is not in the Hugging Face cache ({e}); fetch it "
                         f"once with `python -m minimind_lib download bench --tasks "
                         f"{','.join(args.tasks)}`") from None
    return 0


COMMANDS["plan"] = ("what a profile will train: tokens, steps, passes, estimated time",
                    add_plan_arguments, run_plan)
COMMANDS["download"] = ("fetch MiniMind's datasets or weights (the only command that downloads)",
                        add_download_arguments, run_download)
COMMANDS["runs"] = ("list the stage folders and kept previous runs (with disk use)",
                    add_runs_arguments, run_runs)
COMMANDS["serve"] = ("serve the model over HTTP (OpenAI-compatible)", add_serve_arguments,
                     run_serve)
COMMANDS["bench"] = ("lm-evaluation-harness tasks (MiniMind's benchmarks) on a model: one table",
                     add_bench_arguments, run_bench)
COMMANDS["export"] = ("write a model folder as GGUF (llama.cpp, Ollama) or a Hugging Face folder",
                      add_export_arguments, run_export)


def add_lm_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lm_eval_args", nargs=argparse.REMAINDER,
                        help="lm_eval's own arguments, e.g. --model minimind --model_args "
                             "pretrained=DIR --tasks arc_easy (see `lm-eval --help`)")


def run_lm_eval(args: argparse.Namespace) -> int:
    """lm-evaluation-harness's own command line, with the course's model registered as
    ``--model minimind`` (lm-eval discovers no plugins, so its ``lm_eval`` command alone cannot
    find it); every lm-eval flag passes through."""
    harness_module()  # registers "minimind" with lm-eval (or says how to install lm-eval)
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm_eval", *args.lm_eval_args]
    try:
        cli_evaluate()
    except SystemExit as e:  # lm-eval's argparse and its own exits
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0


COMMANDS["lm-eval"] = ("lm-evaluation-harness's own CLI with the course's model as --model "
                       "minimind (every lm-eval flag passes through)", add_lm_eval_arguments,
                       run_lm_eval)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minimind_lib",
                                     description="MiniMind from Scratch: run the course's stages.")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of an error (or set {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for stage in STAGES.values():
        p = sub.add_parser(stage.name, help=stage.description)
        add_stage_arguments(p)
        if stage.starts_from is not None:
            add_init_argument(p)
        p.set_defaults(func=partial(run_stage, stage.name))
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        add_arguments(p)
        p.set_defaults(func=run)
    return parser


def describe_error(e: BaseException) -> str:
    """One line for the user: the message (an OS error's file and reason); the exception's
    type too when it is not a plain bad-input error, since that is more likely a bug."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        message = f"{e.filename}: {e.strerror}"
    else:
        message = str(e) or type(e).__name__
    if not isinstance(e, ValueError | OSError):
        message = f"{type(e).__name__}: {message} (--debug shows the traceback)"
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # lm-eval's flags are its own: argparse would claim them
        args = argparse.Namespace(func=run_lm_eval, lm_eval_args=argv[1:], debug=False)
    else:
        args = build_parser().parse_args(argv)
    if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        return args.func(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        print(f"error: {describe_error(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
