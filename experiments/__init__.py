"""The commands (`python -m experiments.<command>`: train, compare, analyze, translate, exact_match,
benchmark) and what they are built from: runs/ (one training run), evaluation/ (what reads a finished
run), sweeps/ (many runs), shared/, tasks/, data/ and benchmarks/."""

from experiments.runs.allocator import keep_freed_memory

keep_freed_memory()  # before jax allocates: every entry point here imports this package first
