"""exposition.py: one exposition from several processes, each sample labelled by replica."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from superinfer.cluster.exposition import merge_expositions
from superinfer.server.prometheus import ServerMetrics


def _exposition(num_rejected: int) -> bytes:
    metrics = ServerMetrics("m", None, ["gold"])
    for _ in range(num_rejected):
        metrics.on_rejected("gold", "queue_full", True)
    return generate_latest(metrics.registry)


def test_every_sample_gets_its_replica_and_each_family_appears_once():
    text = merge_expositions([("r1", _exposition(2)), ("r2", _exposition(5))]).decode()
    assert text.count("# TYPE superinfer:rejections_total counter") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    values = {s.labels["replica"]: s.value for s in families["superinfer:rejections"].samples
              if s.labels["reason"] == "queue_full" and s.labels["slo_class"] == "gold"}  # fmt: skip
    assert values == {"r1": 2.0, "r2": 5.0}
