"""Benchmarks: `./dev bench` (benchmarks/run.py) and the older in-process scripts."""
