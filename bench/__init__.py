"""Benchmarks of `runbook` against the tools users would pick instead, side by side in one run.

Run `python -m bench` (`--quick` for a smoke run, `--only NAME` for one benchmark); it writes
bench/RESULTS.md. `harness` holds the measuring and the report, `tools` how each tool runs N steps
on given hosts, and one module per benchmark builds its `harness.Section`.
"""
