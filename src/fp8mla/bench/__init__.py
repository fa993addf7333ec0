"""Benchmark harness: read ceiling, timed cases, JSON records (docs/DESIGN.md §9)."""
