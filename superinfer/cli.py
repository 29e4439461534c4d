"""Command line: `superinfer serve` and `superinfer generate "PROMPT"` (more subcommands join
as they land).

Engine flags are derived from the config dataclasses in `superinfer.config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from superinfer.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from superinfer.extras import missing_extra_message
from superinfer.vllm_flags import (
    add_vllm_flags,
    apply_vllm_flags,
    human_readable_int,
    with_config_file,
)

_TYPES = {"int": int, "float": float, "str": str}
_PARSERS = {"human_int": human_readable_int}


def add_config_flags(
    parser: argparse.ArgumentParser,
    config_type: type,
    title: str,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """One `--flag-name` per dataclass field, with its default and help text; `overrides`
    gives a field another default or help text for this command (`{"max_num_seqs":
    {"default": 256}}`)."""
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(config_type):
        if not f.metadata.get("is_cli", True):
            continue
        override = (overrides or {}).get(f.name, {})
        default = override.get("default", f.default)
        flag = "--" + f.name.replace("_", "-")
        help_text = override.get("help", f.metadata.get("help", ""))
        base_type = str(f.type).split("|")[0].strip()
        if base_type == "bool":
            group.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
            continue
        if base_type == "list[str]":
            group.add_argument(flag, nargs="+", default=default, help=help_text, metavar="STR")
            continue
        choices = f.metadata.get("choices")
        parse = _PARSERS.get(f.metadata.get("parse"), _TYPES[base_type])
        group.add_argument(
            flag, type=parse, default=default, help=help_text, choices=choices,
            metavar=None if choices else base_type.upper(),
        )  # fmt: skip


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    def part(config_type: type) -> Any:
        names = [f.name for f in dataclasses.fields(config_type) if f.metadata.get("is_cli", True)]
        return config_type(**{name: getattr(args, name) for name in names})

    return EngineConfig(part(ModelConfig), part(CacheConfig), part(SchedulerConfig))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="superinfer",
        description="superinfer: an LLM serving engine that keeps latency promises.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = sub.add_parser(
        "generate",
        help="generate an answer to one prompt and print it",
        description="Generate an answer to PROMPT with the model and print it. The model's chat "
        "template is applied unless --no-chat-template is given.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    gen.add_argument("prompt", help="the prompt (a user message unless --no-chat-template)")
    gen.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 means greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    gen.add_argument("--top-k", type=int, default=-1, help="keep the k best tokens (-1: all)")
    gen.add_argument("--sampling-seed", type=int, default=None, help="seed of this request")
    gen.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    gen.add_argument("--system", default=None, help="system message for the chat template")
    gen.add_argument(
        "--chat-template", action=argparse.BooleanOptionalAction, default=True,
        help="wrap the prompt in the model's chat template",
    )  # fmt: skip
    gen.add_argument("-v", "--verbose", action="store_true", help="log engine details to stderr")
    for config_type, title in (
        (ModelConfig, "model"), (CacheConfig, "KV cache"), (SchedulerConfig, "scheduler")
    ):  # fmt: skip
        add_config_flags(gen, config_type, title)
    _add_serve_parser(sub)
    _add_sim_parsers(sub)
    from superinfer.bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def _add_sim_parsers(sub: Any) -> None:
    from superinfer.sim.cli import add_calibrate_parser, add_simulate_parser

    add_simulate_parser(sub)
    add_calibrate_parser(sub)


def _add_serve_parser(sub: Any) -> None:
    from superinfer.cluster.app import ClusterConfig
    from superinfer.server.config import ServerConfig

    serve = sub.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API with per-request SLOs",
        description="Serve the model on an OpenAI-compatible HTTP API (/v1/completions, "
        "/v1/chat/completions, /v1/models, /health, /metrics). Each request may carry latency "
        "targets (x-slo-* headers or the body's 'slo' object, see docs/slo.md); the server "
        "schedules by them, rejects what it cannot keep (425), and reports for every request "
        "whether they were kept. SIGTERM/SIGINT drain the server and exit 0.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument("-v", "--verbose", action="store_true", help="log engine details to stderr")
    serve.add_argument(
        "--config", metavar="FILE", default=None,
        help="YAML file of flags, as vLLM's: `port: 8001`, `served-model-name: [a, b]`, "
        "`enable-prefix-caching: false`; flags on the command line win",
    )  # fmt: skip
    add_vllm_flags(serve)
    add_config_flags(serve, ServerConfig, "server")
    add_config_flags(serve, ClusterConfig, "scale-out (--replicas N)")
    for config_type, title in (
        (ModelConfig, "model"), (CacheConfig, "KV cache"), (SchedulerConfig, "scheduler")
    ):  # fmt: skip
        add_config_flags(serve, config_type, title)


def run_serve(args: argparse.Namespace) -> int:
    from superinfer.server.launcher import run_server

    server, config, slo_config, cluster = serve_configs_from_args(args)
    if cluster.router == "ray":  # also with one replica: a Ray Serve application
        from superinfer.cluster.app import run_cluster

        return run_cluster(server, config, slo_config, cluster)
    if cluster.replicas > 1:
        from superinfer.cluster.local import run_local_cluster

        return run_local_cluster(server, config, slo_config, cluster)
    return run_server(server, config, slo_config)


def serve_configs_from_args(args: argparse.Namespace) -> tuple[Any, EngineConfig, Any, Any]:
    """(ServerConfig, EngineConfig, SLOConfig, ClusterConfig) of `superinfer serve` flags."""
    from superinfer.cluster.app import ClusterConfig
    from superinfer.core.policies import available_policies
    from superinfer.server.config import ServerConfig
    from superinfer.server.serving_defaults import serving_defaults_of
    from superinfer.slo.classes import load_slo_config

    apply_vllm_flags(args, _serve_defaults())
    if args.policy not in available_policies():
        raise ValueError(f"unknown policy {args.policy!r}; choose one of {available_policies()}")
    names = [f.name for f in dataclasses.fields(ServerConfig)]
    server = ServerConfig(**{name: getattr(args, name) for name in names})
    if server.api_key is None:
        server.api_key = os.environ.get("SUPERINFER_API_KEY") or None
    slo_config = load_slo_config(server.slo_config)
    config = engine_config_from_args(args)
    scheduler = dataclasses.replace(
        config.scheduler, class_reservations=slo_config.reservations(),
        class_order=tuple(slo_config.class_names),
    )  # fmt: skip
    config = dataclasses.replace(config, scheduler=scheduler)
    serving_defaults_of(server, config)  # a bad --chat-template or --generation-config: exit 2
    cluster_names = [f.name for f in dataclasses.fields(ClusterConfig)]
    cluster = ClusterConfig(**{name: getattr(args, name) for name in cluster_names})
    return server, config, slo_config, cluster


def _serve_defaults() -> dict[str, Any]:
    parser = build_parser()
    return vars(parser.parse_args(["serve"]))


def run_generate(args: argparse.Namespace) -> int:
    from superinfer.engine.llm import LLM
    from superinfer.sampling_params import SamplingParams

    llm = LLM.from_config(engine_config_from_args(args))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.sampling_seed, stop=args.stop,
    )  # fmt: skip
    if args.chat_template:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        (output,) = llm.chat(messages, params)
    else:
        (output,) = llm.generate(args.prompt, params)
    print(output.outputs[0].text)
    llm.engine.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        argv = with_config_file(parser, list(sys.argv[1:] if argv is None else argv))
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    args = parser.parse_args(argv)
    if args.command == "serve":
        from superinfer.logs import configure_logging

        configure_logging(args.log_level)
        if args.verbose:  # -v: superinfer's debug lines too
            logging.getLogger("superinfer").setLevel(logging.DEBUG)
    else:
        logging.basicConfig(
            level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    try:
        if args.command == "generate":
            return run_generate(args)
        if args.command == "serve":
            return run_serve(args)
        if args.command == "bench":
            from superinfer.bench.cli import run_bench

            return run_bench(args)
        if args.command in ("simulate", "calibrate"):
            from superinfer.sim import cli as sim_cli

            return (
                sim_cli.run_simulate(args)
                if args.command == "simulate"
                else sim_cli.run_calibrate(args)
            )
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"superinfer: error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        message = missing_extra_message(error)
        if message is None:
            raise
        print(f"superinfer: error: {message}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
