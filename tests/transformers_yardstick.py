"""Our logits against transformers' own for a tiny random model saved to a folder: the yardstick of the import
tests (tests/test_pretrained.py, tests/test_pretrained_gemma.py). Imports PyTorch: only for tests that have it."""

import numpy as np
import torch

import transformer as T
from experiments.pretrained import hugging_face


def random_model(architecture: str, config_class, scale: float, **fields):
  """transformers' architecture with config_class(**fields), seeded, every weight (norms' scales too) moved by
  scale x N(0, 1) far from its initialisation, so that nothing cancels."""
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  model = getattr(transformers, architecture)(config_class(**fields)).eval()
  with torch.no_grad():
    for parameter in model.parameters():
      parameter.add_(scale * torch.randn_like(parameter))
  return model


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


def export_round_trip(config, folder, length: int, architecture: str):
  """A random model of ours for config (weights far from their initialisation) exported to folder as the
  architecture: transformers loads it with our logits on 2 x length ids, and it reads back as the same config with
  the same logits exactly."""
  import json  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from flax.core import meta  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  from experiments.pretrained import hugging_face_export  # pylint: disable=import-outside-toplevel
  ids = np.random.default_rng(3).integers(0, config.vocab_size, size=(2, length))
  model = T.DecoderOnly(config)
  variables = meta.unbox(model.init(jax.random.PRNGKey(0), ids[:, :8]))
  noise = np.random.default_rng(4)
  variables = jax.tree_util.tree_map(lambda x: x + 0.3 * noise.normal(size=x.shape).astype(np.float32), variables)
  assert hugging_face_export.architecture(config) == architecture
  (folder / 'config.json').write_text(json.dumps(hugging_face_export.hf_config(config, 2048)))
  save_file(hugging_face_export.hf_tensors(variables, config), str(folder / 'model.safetensors'))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
  assert type(theirs).__name__ == architecture
  with torch.no_grad():
    expected = theirs(torch.tensor(ids)).logits.numpy()
  got = np.asarray(model.apply(variables, ids))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
  read_config, read_params = hugging_face.load(str(folder))
  assert read_config == config
  np.testing.assert_array_equal(np.asarray(T.DecoderOnly(read_config).apply(read_params, ids)), got)
