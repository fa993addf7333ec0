"""Benchmark harness: read ceiling, timed cases, JSON records (DESIGN.md §9)."""
