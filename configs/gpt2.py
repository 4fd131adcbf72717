"""Decoder language models of GPT-2's shapes on a prepared corpus, for positional encodings at the scale the
field compares them: `small` (12 layers, 768 wide, 12 heads) and `medium` (24 layers, 1024 wide, 16 heads),
length 1024, bfloat16 compute, parameters and optimizer state split over every device (fsdp=-1).

Command:  python -m experiments.train --config=configs/gpt2.py:small --workdir=runs/gpt2-small \
              --config.task.path=corpora/mine [--config.model.position.kind=alibi]
          (a corpus with GPT-2's vocabulary: python -m experiments.prepare_corpus --input=DIR
          --output=corpora/mine --vocab_size=50257; the shipped corpus has 4,096 tokens)
Parameters: small 85.1M in its layers, plus 38.6M of embedding with 50,257 tokens (123.7M; 88.2M with the
          shipped corpus's 4,096); medium 302.3M plus 51.5M (353.8M; 306.5M). Tied input and output
          embeddings, RoPE.
Memory per device, as the run's start-up line computes it (experiments/runs/sharding.py), on one device with
          50,257 tokens: small, parameters 0.46 GiB, optimizer state 0.92 GiB, activations about 30.9 GiB at
          batch 32 (its float32 logits and their gradient 12.3 of them); medium 1.32, 2.64 and about 61.9 GiB.
          fsdp over N devices divides the first two by N, and the batch splits over the devices;
          train.gradient_accumulation=k divides the activations by k.
Tokens/s: not measured yet (no accelerator was lent where this was written):
          experiments/benchmarks/gpu_check.sh measures the small preset's step on the first GPU.
On a machine of 24 GiB without an accelerator the medium preset is refused before compiling (54.0 GiB for
one device); tests/test_presets.py steps each at length 32 on 8 CPU devices to check their shapes and
shardings, not their speed.
"""

from configs import base
from configs.corpus import SHIPPED

SHAPES = {  # name: (layers, width, heads, learning rate)
    'small': (12, 768, 12, 6e-4),
    'medium': (24, 1024, 16, 3e-4),
}


def get_config(size: str = 'small'):
  if size not in SHAPES:
    raise ValueError(f'configs/gpt2.py: got {size!r}; valid: {", ".join(SHAPES)} (--config=configs/gpt2.py:small)')
  layers, width, heads, learning_rate = SHAPES[size]
  config = base.get_base_config()
  config.parallel.mode = 'mesh'
  config.parallel.fsdp = -1
  config.task.name = 'corpus'
  config.task.path = SHIPPED
  config.task.max_length = 1024
  config.task.eval_lengths = (1024, 2048, 4096, 8192)
  config.task.eval_batches = 8
  config.model.model_dim = width
  config.model.num_heads = heads
  config.model.feed_forward_dim = 4 * width
  config.model.num_decoder_layers = layers
  config.model.activation = 'gelu'
  config.model.compute_dtype = 'bfloat16'
  config.model.position.kind = 'rope'
  config.model.position.max_length = 8192
  config.train.steps = 20000
  config.train.batch_size = 32
  config.train.learning_rate = learning_rate
  config.train.schedule = 'warmup_cosine'
  config.train.warmup_steps = 700
  config.train.beta2 = 0.95
  config.train.epsilon = 1e-8
  config.train.weight_decay = 0.1
  config.train.log_every = 10
  config.train.eval_every = 1000
  config.train.checkpoint_every = 1000
  return config
