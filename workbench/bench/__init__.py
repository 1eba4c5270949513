"""Benchmarks: policy runs, the reference decoder, op counts, profiling, prompts."""
