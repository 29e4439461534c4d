"""Scale-out: superinfer replicas on Ray Serve behind an SLO-aware router (docs/scale-out.md)."""
