"""Delivery-throughput benchmarks. Run with ``make bench`` or ``python -m benchmarks``."""
