"""Benchmarks: measure the dispatcher (and later the engine and trainer) against baselines."""
