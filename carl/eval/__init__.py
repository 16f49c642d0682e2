"""Evaluation: the benchmark runner over held-out tasks and its reports."""
