"""Command-line entry points, the training loop, parallelism, checkpoints, metrics and tasks."""
