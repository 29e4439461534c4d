"""vLLM's `vllm serve` spellings for `superinfer serve`.

Where superinfer has the concept under another name, the vLLM flag is an alias resolved
into superinfer's own field (`--swap-space` is the host tier, `--scheduling-policy fcfs`
is vLLM v1's scheduler); where it has none, the flag is refused with what to use instead.
vLLM's flags whose name and meaning superinfer shares (`--max-model-len`, `--dtype`,
`--kv-cache-memory-bytes`, `--gpu-memory-utilization`, `--served-model-name`, ...) are
plain config fields. docs/vllm-migration.md maps every one; tests check the map.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

# vLLM's scheduling policies, by the superinfer policy that behaves as they do
SCHEDULING_POLICIES = {"fcfs": "fcfs-recompute", "priority": "priority"}

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """vLLM's byte counts: `4G` = 4 x 2^30, `4g` = 4 x 10^9, `25.6k` = 25600, `1024`."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid size {value!r} (e.g. 4G, 512M, 2g, 1024)")
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"{value!r}: a binary suffix takes a whole number (did you mean {number}"
            f"{suffix.lower()}?)"
        )
    return int(number) * _BINARY.get(suffix, 1)


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """The positional MODEL and the vLLM aliases (defaults None: unset)."""
    parser.add_argument(
        "model_tag", nargs="?", default=None, metavar="MODEL",
        help="the model, as `vllm serve MODEL` takes it (same as --model)",
    )  # fmt: skip
    group = parser.add_argument_group(
        "vLLM's spellings", "Aliases for vLLM users; docs/vllm-migration.md maps every flag."
    )
    group.add_argument(
        "--swap-space", type=float, default=None, metavar="GIB",
        help="vLLM's CPU swap space: the host KV tier's size in GiB (= --host-kv-gib)",
    )  # fmt: skip
    group.add_argument(
        "--scheduling-policy", default=None, metavar="POLICY",
        help="vLLM's fcfs (= --policy fcfs-recompute) or priority (= --policy priority), "
        "or any superinfer policy name",
    )  # fmt: skip
    group.add_argument(
        "-dp", "--data-parallel-size", type=int, default=None, metavar="N",
        help="engine copies serving one endpoint (= --replicas)",
    )  # fmt: skip
    group.add_argument(
        "-tp", "--tensor-parallel-size", type=int, default=None, metavar="N",
        help="only 1: superinfer runs one model copy per engine; scale out with --replicas",
    )  # fmt: skip
    group.add_argument(
        "-pp", "--pipeline-parallel-size", type=int, default=None, metavar="N",
        help="only 1: superinfer runs one model copy per engine; scale out with --replicas",
    )  # fmt: skip
    group.add_argument(
        "--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
        help="always on in superinfer (prefill chunks share the step's token budget); "
        "--no-enable-chunked-prefill is refused",
    )  # fmt: skip
    group.add_argument(
        "--disable-log-requests", action="store_true", default=False,
        help="deprecated in vLLM; requests are not logged unless --enable-log-requests",
    )  # fmt: skip
    group.add_argument(
        "--kv-cache-dtype", default=None, metavar="DTYPE",
        help="only auto: the KV cache has the model's dtype",
    )  # fmt: skip
    for flag, meaning in _REFUSED_VALUES.items():
        group.add_argument(*flag, default=None, metavar="VALUE", help=f"refused: {meaning}")
    group.add_argument(
        "--trust-remote-code", action="store_true", default=False,
        help="refused: superinfer runs only the architectures it implements, never a model's code",
    )  # fmt: skip


# flags for what superinfer does not have: any value is refused, with this reason
_REFUSED_VALUES = {
    ("--tokenizer",): "the model's own tokenizer is used (its directory or GGUF file)",
    ("--revision",): "models are local paths (a Hugging Face directory or a .gguf file)",
}


def apply_vllm_flags(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    """Resolve the vLLM aliases in `args` into superinfer's fields, in place.

    `defaults` are the parser's defaults: an alias conflicts with its superinfer flag only
    when that flag was set to something else. Raises ValueError for what superinfer cannot
    do, naming what to use instead."""
    _alias(args, defaults, "model", args.model_tag, "MODEL", "--model")
    _alias(args, defaults, "host_kv_gib", args.swap_space, "--swap-space", "--host-kv-gib")
    _alias(args, defaults, "replicas", args.data_parallel_size, "--data-parallel-size",
           "--replicas")  # fmt: skip
    policy = args.scheduling_policy
    if policy is not None:
        policy = SCHEDULING_POLICIES.get(policy, policy)
    _alias(args, defaults, "policy", policy, "--scheduling-policy", "--policy")
    for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size),
                        ("--pipeline-parallel-size", args.pipeline_parallel_size)):  # fmt: skip
        if value is not None and value != 1:
            raise ValueError(
                f"{flag} {value}: superinfer runs one model copy per engine and has no model "
                "parallelism; to use several devices or machines run several engines behind "
                "one endpoint with --replicas N (docs/scale-out.md)"
            )
    for flag, meaning in _REFUSED_VALUES.items():
        value = getattr(args, flag[-1][2:].replace("-", "_"))
        if value is not None:
            raise ValueError(f"{flag[-1]} {value}: not supported, {meaning}")
    if args.trust_remote_code:
        raise ValueError(
            "--trust-remote-code: superinfer runs only the architectures it implements "
            "(docs/configuration.md) and never executes a model's own code"
        )
    if args.kv_cache_dtype not in (None, "auto"):
        raise ValueError(f"--kv-cache-dtype {args.kv_cache_dtype}: only auto (the model's dtype)")
    if args.enable_chunked_prefill is False:
        raise ValueError(
            "--no-enable-chunked-prefill: superinfer always chunks prefills under the step's "
            "token budget (--max-num-batched-tokens); raise that budget to prefill in one step"
        )


def _alias(
    args: argparse.Namespace, defaults: dict[str, Any], field: str, value: Any,
    alias: str, flag: str,
) -> None:  # fmt: skip
    if value is None:
        return
    current = getattr(args, field)
    if current != defaults.get(field) and current != value:
        raise ValueError(f"{alias} {value} and {flag} {current} disagree; give one of them")
    setattr(args, field, value)


def with_config_file(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with the flags of `--config FILE` put right after the subcommand, as vLLM
    reads its YAML config: keys are flag names (`max-model-len` or `max_model_len`), a
    list is several values, true/false set or clear a switch; the command line wins."""
    names = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not names:
        return argv
    i = names[-1]
    if argv[i] == "--config":
        if i + 1 >= len(argv):
            raise ValueError("--config needs a FILE")
        path, rest = argv[i + 1], argv[:i] + argv[i + 2 :]
    else:
        path, rest = argv[i].split("=", 1)[1], argv[:i] + argv[i + 1 :]
    command = next((a for a in rest if not a.startswith("-")), None)
    subparser = _subparsers(parser).get(command)
    if subparser is None:
        raise ValueError("--config is a flag of `superinfer serve`")
    flags = _config_flags(subparser, _load_yaml(path))
    at = rest.index(command) + 1
    return rest[:at] + flags + rest[at:]


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    with open(os.path.expanduser(path)) as f:
        config = yaml.safe_load(f) or {}
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: expected a mapping of flag names to values")
    return config


def _config_flags(parser: argparse.ArgumentParser, config: dict[str, Any]) -> list[str]:
    actions = {s: a for a in parser._actions for s in a.option_strings}
    flags: list[str] = []
    for key, value in config.items():
        flag = "--" + str(key).replace("_", "-")
        if flag == "--model-tag":
            flag = "--model"
        action = actions.get(flag)
        if action is None:
            raise ValueError(f"--config: unknown flag {key!r} (see superinfer serve --help)")
        if value is None:
            continue
        if isinstance(value, bool):
            if isinstance(action, argparse.BooleanOptionalAction):
                flags.append(flag if value else "--no-" + flag[2:])
            elif value:
                flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
