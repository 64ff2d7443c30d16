"""Measurement: the protocol, one timed call, sampling rounds, telemetry, statistics, the environment.

Torch-free at import, and below every model: it measures calls it is given (docs/architecture.md).
"""
