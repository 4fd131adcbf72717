"""One training run: its settings and record, preflight, the loop and its steps (with the trainer's own
evaluation), checkpoints, metrics, device placement and sharding, seeds in one program. Imports shared/,
tasks/ and data/, never evaluation/ or sweeps/."""
