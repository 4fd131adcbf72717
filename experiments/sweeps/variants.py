"""Which positional variants a sweep's --positions names (no flags here, so tests can import it)."""


def variants_from_flag(value: str, bidirectional: bool = False) -> list[str]:
  """The variants --positions names; 'all': every variant the model can take (with a bidirectional
  stack, every variant that is not causal only)."""
  import transformer  # pylint: disable=g-import-not-at-top
  if value == 'all':
    return [kind for kind, variant in transformer.VARIANTS.items() if not (bidirectional and variant.causal_only)]
  chosen = [v.strip() for v in value.split(',') if v.strip()]
  unknown = [v for v in chosen if v not in transformer.VARIANTS]
  if unknown or not chosen or len(set(chosen)) < len(chosen):
    raise ValueError(f'--positions: got {value!r}; valid: all, or a comma-separated list (each once) of '
                     f'{", ".join(transformer.VARIANTS)}')
  return chosen
