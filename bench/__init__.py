"""Benchmarks: `python -m bench.bench_x` times our code against a reference, as ratios."""
