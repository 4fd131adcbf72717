"""Command-line entry points, the training loop, parallelism, checkpoints, metrics and tasks."""

from experiments.allocator import keep_freed_memory

keep_freed_memory()  # before jax allocates: every entry point here imports this package first
