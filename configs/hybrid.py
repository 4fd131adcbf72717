"""Positions by layer, as the open decoders of 2024-2026 place them: sliding windows, chunks, sinks and NoPE layers,
in the Llama-style block of configs/llama.py at its Shakespeare, corpus or passkey budget (the same data, steps,
batch and schedule), six layers deep so that every cycle below holds a global layer.

  preset     layers (a cycle over the stack)              positions                   what else    model, paper
  rope       full                                          RoPE                                     the baseline
  nope       full                                          none                                     Haviv et al. 2022
  swa        sliding                                       RoPE                                     Mistral 7B (Jiang et al. 2023)
  rnope      full                                          RoPE, RoPE, RoPE, none                   Yang et al. 2025, "Rope to Nope
                                                           (position.layer_pattern)                 and back again" (RNoPE)
  rnope_swa  sliding, sliding, sliding, full               RoPE local, none global                  Command A (Cohere 2025)
  irope      chunked, chunked, chunked, full               RoPE local, none global with             Llama 4 (Meta 2025), iRoPE
                                                           the temperature (floor: the training length)
  gemma3     sliding x 5, full                             RoPE base 1e4 local, 1e6     QK-norm,   Gemma 3 (Gemma Team 2025)
                                                           global                       sandwich
  gpt_oss    sliding, full                                 RoPE                         sinks      GPT-OSS (OpenAI 2025)
  smollm3    full                                          RoPE, RoPE, RoPE, none                   SmolLM3 (Hugging Face 2025), the
                                                           (every fourth layer NoPE)                rnope cycle at its layers 3, 7, ...

The window W and the chunk C are a quarter of the training length (32 of 128 on Shakespeare, 64 of 256 on the
corpus, 64 of 256 at the passkey budget); half is --config.model.sliding_window=64 (and attention_chunk_size).
Budget: the preset's name alone is Shakespeare's, 'PRESET,corpus' the shipped corpus's, 'PRESET,passkey'
configs/shakespeare.py:passkey's (Shakespeare at 256 with nine in ten rows passkey prompts, for the retrieval
probe: python -m experiments.evaluate --workdir=RUN --probe=passkey --lengths=256,512,1024,2048).

Command:  python -m experiments.train --config=configs/hybrid.py:gemma3 --workdir=runs/hybrid-gemma3
          python -m experiments.train --config=configs/hybrid.py:rnope_swa,corpus --workdir=runs/hybrid-rnope-swa-corpus \
              --config.model.sliding_window=128
"""

from configs import llama

LAYERS = 6
PRESETS = ('rope', 'nope', 'swa', 'rnope', 'rnope_swa', 'irope', 'gemma3', 'gpt_oss', 'smollm3')
BUDGETS = ('shakespeare', 'corpus', 'passkey')


def _position(config, section: str, kind: str, **settings) -> None:
  """config.model.<section> set to a variant and its settings."""
  position = getattr(config.model, section)
  position.kind = kind
  for name, value in settings.items():
    setattr(position, name, value)


def _layers(config, layer_types: str) -> None:
  config.model.layer_types = layer_types
  quarter = config.task.max_length // 4
  config.model.sliding_window = quarter if 'sliding' in layer_types else 0
  config.model.attention_chunk_size = quarter if 'chunked' in layer_types else 0


def _apply(config, preset: str) -> None:
  """The preset's layers, positions and attention on the Llama block (RoPE everywhere, every layer full)."""
  if preset == 'nope':
    _position(config, 'position', 'none')
  elif preset == 'swa':
    _layers(config, 'sliding')
  elif preset in ('rnope', 'smollm3'):
    _position(config, 'position', 'layer_pattern', layer_pattern='rope,rope,rope,none')
  elif preset == 'rnope_swa':
    _layers(config, 'sliding,sliding,sliding,full')
    _position(config, 'position', 'none')
    _position(config, 'local_position', 'rope', rope_base=config.model.position.rope_base)
  elif preset == 'irope':
    _layers(config, 'chunked,chunked,chunked,full')
    _position(config, 'position', 'none', temperature_scale=0.1, temperature_floor=config.task.max_length)
    _position(config, 'local_position', 'rope', rope_base=config.model.position.rope_base)
  elif preset == 'gemma3':
    _layers(config, 'sliding,sliding,sliding,sliding,sliding,full')
    _position(config, 'position', 'rope', rope_base=1e6)
    _position(config, 'local_position', 'rope', rope_base=1e4)
    config.model.qk_norm = 'head'
    config.model.sandwich_norm = True
  elif preset == 'gpt_oss':
    _layers(config, 'sliding,full')
    config.model.attention_sinks = True


def get_config(argument: str = 'rope'):
  preset, _, budget = argument.partition(',')
  budget = budget or 'shakespeare'
  if preset not in PRESETS or budget not in BUDGETS:
    raise ValueError(f'configs/hybrid.py: got {argument!r}; valid: PRESET or PRESET,BUDGET with PRESET one of '
                     f'{", ".join(PRESETS)} and BUDGET one of {", ".join(BUDGETS)} (--config=configs/hybrid.py:gemma3)')
  config = llama.get_config(budget)
  config.model.num_decoder_layers = LAYERS
  _apply(config, preset)
  return config
