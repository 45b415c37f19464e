"""The `omni` command line.

    omni run [CONFIG] [--model DIR] --prompt TEXT [--image PATH ...] [--raw] [--json]
             [--set KEY=VALUE ...] [--var NAME=VALUE ...] [--max-tokens N] [--output-wav PATH]
             [--stream-audio]
    omni convert-gguf GGUF OUT_DIR [--dtype float32|bfloat16|float16]
    omni validate [CONFIG] [--model DIR] [--set KEY=VALUE ...] [--var NAME=VALUE ...] [--num-gpus N]
    omni serve [CONFIG] [--model DIR] [--host 127.0.0.1] [--port 8000] [--served-model-name NAME]
               [--api-key KEY] [--set ...] [--var ...] [--allowed-local-media-path DIR]
               [--allow-remote-media] [--max-tokens N] [--tool-call-parser NAME]

`--model DIR` is `--var MODEL=DIR` (configs say `model: ${MODEL}/thinker`). `--set` overrides any
config key by its path, stages by name: `--set stages.thinker.engine.num_blocks=512`
(values parse as YAML). `validate` is torch-free (only omni.config) and exits with status 2 and
the message on a bad config; it also prints each stage's placement (device, GPU share, memory
share, dtype) planned for `--num-gpus` GPUs (default: those this machine shows). `run` and
`serve` exit the same way before loading any model. `run`, `serve` and `validate` take CONFIG or
only `--model DIR` (the stage config of the family claiming its model_type, or a one-stage
causal LM). `serve --max-tokens N` is the max_tokens of a request that sets none (unset: until
the context ends, as OpenAI's API); `run --max-tokens N` sets every stage's sampling.max_tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from omni.config import ConfigError, OmniConfig, config_for_model, load_config
from omni.config.devices import describe_plan, plan_gpus
from omni.entrypoints.openai.args import TOOL_CALL_PARSERS

EXIT_CONFIG = 2
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def config_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
        if optional:
            p.add_argument(
                "config", nargs="?", help="stage-config YAML file (default: from --model)"
            )
        else:
            p.add_argument("config", help="stage-config YAML file")
        for flag, dest, metavar, what in (
            ("--set", "overrides", "KEY=VALUE", "override a config key"),
            ("--var", "variables", "NAME=VALUE", "define ${NAME} in the config"),
        ):
            p.add_argument(flag, dest=dest, action="append", default=[], metavar=metavar,
                           help=f"{what} (repeatable)")  # fmt: skip
        p.add_argument("--model", metavar="DIR", help="checkpoint directory: sets ${MODEL}")

    run = commands.add_parser("run", help="run one prompt through the pipeline")
    config_args(run, optional=True)
    run.add_argument("--prompt", required=True, help="the text prompt")
    run.add_argument(
        "--raw", action="store_true", help="send the text as is, without the chat template"
    )
    run.add_argument("--json", action="store_true", help="print a machine-readable result")
    run.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="an image for the prompt (repeatable; multimodal root stages)",
    )
    run.add_argument(
        "--max-tokens", type=int, metavar="N", help="sampling.max_tokens of every stage"
    )
    run.add_argument(
        "--output-wav", metavar="PATH", help="write the final stage's audio (16-bit PCM WAV)"
    )
    run.add_argument(
        "--stream-audio",
        action="store_true",
        help="the streaming path (AsyncOmni.generate's stream_audio): write --output-wav as the "
        "audio chunks come; report the time to first audio and the real-time factor",
    )

    convert = commands.add_parser(
        "convert-gguf", help="write a GGUF checkpoint as a transformers safetensors directory"
    )
    convert.add_argument("gguf", help="the .gguf file (e.g. llama.cpp's Q4_1)")
    convert.add_argument("out_dir", help="a new (or empty) output directory")
    convert.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")

    validate = commands.add_parser(
        "validate", help="check a config and print its stage graph and device plan"
    )
    config_args(validate, optional=True)
    validate.add_argument(
        "--num-gpus",
        type=float,
        metavar="N",
        help="plan for N GPUs (default: the NVIDIA GPUs this machine shows; a Ray cluster's "
        "may differ)",
    )

    serve = commands.add_parser("serve", help="serve the pipeline over an OpenAI-compatible API")
    config_args(serve, optional=True)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--served-model-name", metavar="NAME", help="the `model` clients name (default: --model)"
    )
    serve.add_argument("--api-key", metavar="KEY", help="require `Authorization: Bearer KEY`")
    serve.add_argument(
        "--max-tokens", type=int, metavar="N", help="a request's default max_tokens (unset: no cap)"
    )
    serve.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default="hermes",
        help="how replies with tool_choice 'auto' are read for calls: hermes (default, Qwen's "
        "<tool_call>JSON</tool_call>), llama3_json, pythonic (Llama's); none: 'auto' is refused",
    )
    serve.add_argument(
        "--allowed-local-media-path",
        metavar="DIR",
        help="image/audio URLs may name local files under DIR",
    )
    serve.add_argument(
        "--allow-remote-media", action="store_true", help="fetch http(s) image/audio URLs"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "convert-gguf":
        return _convert(args)
    try:
        config = _load(args)
        if args.command == "validate":
            num_gpus = machine_gpus() if args.num_gpus is None else args.num_gpus
            text = summary(config) + "\n" + plan_summary(config, num_gpus)
    except ConfigError as e:
        print(f"omni: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "validate":
        print(text)
        return 0
    if args.command == "serve":
        return _serve(args, config)
    from omni.entrypoints.run_command import run

    return run(args, config)


def _load(args: argparse.Namespace) -> OmniConfig:
    variables: dict[str, str] = {}
    for item in args.variables:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--var expects NAME=VALUE, got {item!r}")
        variables[name] = value
    if args.model is not None:
        variables["MODEL"] = args.model
    overrides = list(args.overrides)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
    if args.config is None and args.model is None:
        raise ConfigError("give a stage-config file or --model DIR")

    def load(overrides: list[str]) -> OmniConfig:
        if args.config is None:
            return config_for_model(args.model, overrides)
        return load_config(args.config, overrides, variables)

    config = load(overrides)
    if args.command == "run" and args.max_tokens is not None:  # serve's is a request default
        # Stage names are only known after a first load; the override then covers every stage.
        names = config.stage_names
        config = load(
            overrides + [f"stages.{n}.sampling.max_tokens={args.max_tokens}" for n in names]
        )
    return config


def summary(config: OmniConfig) -> str:
    """The stages, in topological order, and the edges of a config."""
    runtime = config.runtime
    where = (
        (runtime.address or "a local Ray instance") if runtime.backend == "ray" else "in-process"
    )
    lines = [f"backend: {runtime.backend} ({where}); {len(config.stages)} stage(s)"]
    for name in config.topological_order():
        s = config.stage(name)
        e, r = s.engine, s.resources
        caching = (
            "prefix+output caching"
            if e.outputs_cached
            else ("prefix caching" if e.enable_prefix_caching else "no caching")
        )
        custom = "".join(f", {k}={v:g}" for k, v in r.custom.items())
        gpus = "planned" if r.num_gpus is None else f"{r.num_gpus:g}"
        lines.append(f"  stage {name}: {s.kind} {s.adapter} model={s.model}")
        lines.append(
            f"    engine: {e.num_blocks or 'auto'} blocks x {e.block_size} tokens, {caching}, "
            f"dtype {e.dtype or 'null'}; "
            f"resources: cpus={r.num_cpus:g}, gpus={gpus}{custom}"
        )
    edges = [f"  {up} -> {s.name} ({s.input_processor})" for s in config.stages for up in s.inputs]
    lines.append("edges:" if edges else "edges: none")
    lines.extend(edges)
    roots = ", ".join(s.name for s in config.root_stages)
    lines.append(f"root stage(s): {roots}; final stage: {config.final_stage.name}")
    return "\n".join(lines)


def plan_summary(config: OmniConfig, num_gpus: float) -> str:
    """Where each stage runs with `num_gpus` GPUs (omni/config/devices.py): device, the GPU
    (fraction) it takes, its memory share and dtype; a ConfigError when the plan cannot hold."""
    planned = plan_gpus(config, num_gpus=num_gpus, what=f"--num-gpus is {num_gpus:g}")
    lines = [f"device plan with {num_gpus:g} GPU(s):"]
    for p in describe_plan(config, planned):
        if p.device == "cpu":
            where = "cpu"
        else:
            source, share = " (planned)" if p.planned else "", p.gpu_memory_utilization
            where = f"cuda, {p.num_gpus:.3g} GPU{source}, memory share {share:.3g}"
        lines.append(f"  {p.name}: {where}, {p.dtype}")
    return "\n".join(lines)


def machine_gpus() -> int:
    """The NVIDIA GPUs this process would see, without torch: the driver's list
    (/proc/driver/nvidia/gpus), cut to CUDA_VISIBLE_DEVICES when that is set (CUDA stops at the
    first negative id, so "" and "-1" hide them all)."""
    try:
        found = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        found = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    count = 0
    for device in visible.split(","):
        if not device.strip() or device.strip().startswith("-"):
            break
        count += 1
    return min(count, found)


def _convert(args: argparse.Namespace) -> int:
    from omni.entrypoints.convert_gguf import convert_gguf

    try:
        out = convert_gguf(args.gguf, args.out_dir, dtype=args.dtype)
    except (OSError, ValueError, ImportError) as e:
        print(f"omni: convert-gguf: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {out}")
    return 0


def _serve(args: argparse.Namespace, config: OmniConfig) -> int:
    from omni.entrypoints.async_omni import AsyncOmni
    from omni.entrypoints.openai.args import ServerArgs
    from omni.entrypoints.openai.server import run_server

    if args.port < 0 or args.port > 65535:
        print(f"omni: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return EXIT_CONFIG
    if args.max_tokens is not None and args.max_tokens < 1:
        print(f"omni: --max-tokens must be >= 1, got {args.max_tokens}", file=sys.stderr)
        return EXIT_CONFIG
    media = args.allowed_local_media_path
    if media is not None and not os.path.isdir(media):
        print(f"omni: --allowed-local-media-path {media!r} is not a directory", file=sys.stderr)
        return EXIT_CONFIG
    name = args.served_model_name or args.model or config.root_stages[0].model
    server_args = ServerArgs(
        model_name=name,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        max_tokens=args.max_tokens,
        tool_call_parser=args.tool_call_parser,
        allowed_local_media_path=media,
        allow_remote_media=args.allow_remote_media,
    )
    try:
        async_omni = AsyncOmni(config)
    except ConfigError as e:  # e.g. the stages do not fit the Ray cluster's resources
        print(f"omni: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return run_server(async_omni, server_args)


if __name__ == "__main__":
    sys.exit(main())
