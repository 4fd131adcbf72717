"""The subcommands of `python -m experiments.benchmark`: the training step, attention cores, matmuls."""
