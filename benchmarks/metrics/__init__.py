"""Metric files the benchmarks load, in Skynet form (`score(input, output, expected=None)`)."""
