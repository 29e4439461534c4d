"""The OpenAI-compatible HTTP server (`superinfer serve`): SLO binding at ingress,
admission, streaming, metrics, the SLO record log, warm-up and graceful drain."""
