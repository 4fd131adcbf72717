"""The commands (`python -m experiments.<command>`: train, compare, analyze, translate, exact_match,
benchmark) and what they are built from: runs/ (one training run), evaluation/ (what reads a finished
run), sweeps/ (many runs), shared/, tasks/, data/ and benchmarks/."""

from experiments.runs.allocator import keep_freed_memory

keep_freed_memory()  # before jax allocates: every entry point here imports this package first


def load_run(workdir: str):
  """model, variables, tokenizer = load_run('runs/NAME'): a run trained here or imported, as its Flax module,
  {'params': ...} (model.apply(variables, tokens_BxL) gives the logits) and its tokenizers.Tokenizer, or None
  where the run has none (experiments/runs/checkpoints.py: load_model)."""
  from experiments.runs.checkpoints import load_model  # pylint: disable=g-import-not-at-top
  return load_model(workdir)
