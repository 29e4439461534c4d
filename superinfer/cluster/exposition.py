"""One `/metrics` for the whole application: every process's series, each sample with a
`replica` label (the replica id, or "ingress" for the ingress's own counters: rejections
by every replica, requests whose replica failed).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

REPLICA_LABEL = "replica"


def merge_expositions(parts: Iterable[tuple[str, bytes]]) -> bytes:
    """Merge `(replica, exposition)` pairs into one exposition; a family that several
    processes export appears once, with the samples of all of them."""
    families: dict[str, tuple[str, str, list[Sample]]] = {}
    for replica, text in parts:
        for family in text_string_to_metric_families(text.decode()):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, [])
            )
            for sample in family.samples:
                labels = {**sample.labels, REPLICA_LABEL: replica}
                samples.append(sample._replace(labels=labels))
    lines = []
    for name, (kind, doc, samples) in families.items():
        name += "_total" if kind == "counter" else ""  # as prometheus_client writes it
        lines.append(f"# HELP {name} {_escape_help(doc)}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(_sample_line(sample) for sample in samples)
    return ("\n".join(lines) + "\n").encode()


def _sample_line(sample: Sample) -> str:
    labels = ",".join(f'{key}="{_escape_label(value)}"' for key, value in sample.labels.items())
    return f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")
