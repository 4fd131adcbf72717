"""Decoder language models in the Llama-style block (Touvron et al. 2023): pre-RMSNorm (eps 1e-5), a SwiGLU
feed-forward, grouped-query attention, no biases, tied and unscaled embeddings, RoPE. The block the field has
compared positions in since 2023 (FoX, PaTH, stick-breaking, p-RoPE, YaRN, LongRoPE).

  size           layers  width  heads  kv heads  feed-forward  RoPE base  task, budget
  smoke               1     32      4         2            64      10000  configs/smoke.py's (tests)
  shakespeare         2    128      4         2           344      10000  configs/shakespeare.py's
  corpus              2    128      4         2           344      10000  configs/corpus.py's (the shipped corpus)
  passkey             3    128      4         2           344      10000  configs/shakespeare.py:passkey's (retrieval)
  small              12    768     12         4          2048      10000  configs/gpt2.py:small's
  medium             24   1024     16         4          2816      10000  configs/gpt2.py:medium's
  smollm2_135m       30    576      9         3          1536     100000  configs/gpt2.py:small's

shakespeare, corpus and passkey train what configs/shakespeare.py, configs/corpus.py and
configs/shakespeare.py:passkey train, on the same data, steps, batch and schedule: the two blocks side by side at one budget. Their SwiGLU is 344 wide, so that its three
matrices hold the parameters of the 512-wide ReLU feed-forward's two (3 x 344 ~ 2 x 512). small and medium take
Llama's 8/3 of the width rounded up to a multiple of 256. smollm2_135m is HuggingFaceTB/SmolLM2-135M's shape
(head width 64); its vocabulary is the corpus's here.

Command:  python -m experiments.compare --config=configs/llama.py:shakespeare --positions=all --seeds=3 \
              --workdir=runs/llama-shakespeare
          python -m experiments.train --config=configs/llama.py:small --workdir=runs/llama-small \
              --config.task.path=corpora/mine [--config.model.position.kind=fox]
"""

from configs import corpus, gpt2, shakespeare, smoke

SHAPES = {  # name: (layers, width, heads, kv heads, feed-forward, RoPE base)
    'smoke': (1, 32, 4, 2, 64, 10000.0),
    'shakespeare': (2, 128, 4, 2, 344, 10000.0),
    'corpus': (2, 128, 4, 2, 344, 10000.0),
    'passkey': (3, 128, 4, 2, 344, 10000.0),
    'small': (12, 768, 12, 4, 2048, 10000.0),
    'medium': (24, 1024, 16, 4, 2816, 10000.0),
    'smollm2_135m': (30, 576, 9, 3, 1536, 100000.0),
}
BASES = {'smoke': smoke.get_config, 'shakespeare': shakespeare.get_config, 'corpus': corpus.get_config,
         'passkey': lambda: shakespeare.get_config('passkey'),
         'small': lambda: gpt2.get_config('small'), 'medium': lambda: gpt2.get_config('medium'),
         'smollm2_135m': lambda: gpt2.get_config('small')}


def llama_block(config) -> None:
  """The Llama-style block on a config: pre-norm RMSNorm (eps 1e-5), SwiGLU, no biases, tied and unscaled
  embeddings."""
  config.model.norm = 'pre'
  config.model.norm_type = 'rmsnorm'
  config.model.layer_norm_eps = 1e-5
  config.model.activation = 'swiglu'
  config.model.use_bias = False
  config.model.qkv_bias = False
  config.model.tie_embeddings = True
  config.model.scale_embeddings = False


def get_config(size: str = 'small'):
  if size not in SHAPES:
    raise ValueError(f'configs/llama.py: got {size!r}; valid: {", ".join(SHAPES)} (--config=configs/llama.py:small)')
  layers, width, heads, kv_heads, feed_forward, rope_base = SHAPES[size]
  config = BASES[size]()
  llama_block(config)
  config.model.model_dim = width
  config.model.num_heads = heads
  config.model.num_kv_heads = kv_heads
  config.model.feed_forward_dim = feed_forward
  config.model.num_decoder_layers = layers
  config.model.position.kind = 'rope'
  config.model.position.rope_base = rope_base
  return config
