"""A Hugging Face model folder (config.json and model.safetensors, or shards with model.safetensors.index.json) as
this library's decoder: the architecture named in config.json picks its table (ARCHITECTURES: llama.py for
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and SmolLM3ForCausalLM, gpt2.py,
gpt_neox.py, gemma.py for Gemma2ForCausalLM and Gemma3ForCausalLM, olmo.py for Olmo2ForCausalLM and
Olmo3ForCausalLM, cohere.py for Cohere2ForCausalLM), which maps the config to transformer.ModelConfig and every tensor to a
parameter, read tensor by tensor with safetensors' NumPy API
(safetensors_file.py), never needing PyTorch. A tensor no row of the table reads is refused by name.
"""

import os

import transformer
from experiments.pretrained import cohere, gemma, gpt2, gpt_neox, llama, olmo
from experiments.pretrained.safetensors_file import INDEX_FILE, WEIGHTS_FILE, Tensors
from experiments.pretrained.tables import PretrainedError, read_json_object

ARCHITECTURES = {**{name: llama for name in llama.ARCHITECTURES}, gpt2.ARCHITECTURE: gpt2,
                 gpt_neox.ARCHITECTURE: gpt_neox, **{name: gemma for name in gemma.ARCHITECTURES},
                 **{name: olmo for name in olmo.ARCHITECTURES}, **{name: cohere for name in cohere.ARCHITECTURES}}
CONFIG_FILE = 'config.json'


def read_config(folder: str) -> dict:
  path = os.path.join(folder, CONFIG_FILE)
  if not os.path.isfile(path):
    raise PretrainedError(f'--source: {folder} has no {CONFIG_FILE}; valid: a Hugging Face model folder (config.json '
                          f'with {WEIGHTS_FILE} or {INDEX_FILE})')
  return read_json_object(path, 'a model\'s configuration')


# Multimodal classes whose text backbone is served here, when a folder holds it alone.
TEXT_BACKBONES = {'Gemma3ForConditionalGeneration': 'Gemma3ForCausalLM (model_type gemma3_text)'}


def architecture(hf_config: dict) -> str:
  names = hf_config.get('architectures') or []
  if isinstance(names, list) and len(names) == 1 and names[0] in TEXT_BACKBONES:
    raise PretrainedError(f'config.json: architectures: got {names}, a vision tower with its text model; valid: '
                          f'{TEXT_BACKBONES[names[0]]}, the text backbone alone (as Gemma 3 270M and 1B are '
                          'published), which this import reads')
  if not isinstance(names, list) or len(names) != 1 or names[0] not in ARCHITECTURES:
    raise PretrainedError(f'config.json: architectures: got {names}; valid: one of {", ".join(ARCHITECTURES)}')
  return names[0]


def model_config(hf_config: dict) -> transformer.ModelConfig:
  """This library's config of the checkpoint's model; PretrainedError naming the field it cannot serve."""
  name = architecture(hf_config)
  return ARCHITECTURES[name].model_config(hf_config, name)


def params_of(tensors: Tensors, config: transformer.ModelConfig, name: str) -> dict:
  """{'params': ...} of the architecture's tensors, every tensor of the folder read or refused."""
  return ARCHITECTURES[name].params(tensors, tensors.names(), config)


def load(folder: str) -> tuple[transformer.ModelConfig, dict]:
  """(the model's config, its parameters) from a Hugging Face model folder."""
  hf_config = read_config(folder)
  config = model_config(hf_config)
  return config, params_of(Tensors(folder), config, architecture(hf_config))
