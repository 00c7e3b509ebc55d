"""Benchmarks run on a GPU machine (BENCHMARKS.md); each file is also a script."""
