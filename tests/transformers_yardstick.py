"""Our logits against transformers' own for a tiny random model saved to a folder: the yardstick of the import
tests (tests/test_pretrained.py, tests/test_pretrained_gemma.py). Imports PyTorch: only for tests that have it."""

import numpy as np
import torch

import transformer as T
from experiments.pretrained import hugging_face


def compare(model, folder, length: int, dtype=None):
  """Our logits from the folder the model is saved to (its weights in dtype) against transformers' in float32 with
  the same weights (rounded to dtype; its rotary frequencies stay float32), on 2 x length random ids; the config."""
  ids = np.random.default_rng(1).integers(0, model.config.vocab_size, size=(2, length))
  with torch.no_grad():
    if dtype is not None:
      for parameter in model.parameters():
        parameter.copy_(parameter.to(dtype).float())
    expected = model(torch.tensor(ids)).logits.numpy()
  (model if dtype is None else model.to(dtype)).save_pretrained(folder, safe_serialization=True)
  config, params = hugging_face.load(str(folder))
  got = np.asarray(T.DecoderOnly(config).apply(params, ids))
  assert got.shape == expected.shape
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
  return config
