"""One training run: its settings and record, the loop and its steps, evaluation and decoding,
checkpoints, metrics and device placement."""
