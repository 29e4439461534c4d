"""Benchmark workloads, load generation and metrics."""
