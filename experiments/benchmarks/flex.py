"""PyTorch's FlexAttention with ALiBi's and T5's terms as its score_mod: the peer of the Pallas kernel
(transformer/flash_attention.py) in `python -m experiments.benchmark attention --flex`.

An optional extra like peer.py (`pip install -e '.[peer]'`), run in its own process so that PyTorch and
JAX never share a device's memory. One causal attention, forward and backward (the loss sum(out^2), as
the attention benchmark's rows), B x H x L x K, compiled by torch.compile; the term's parameters (ALiBi's
slopes, fixed; T5's bucket table, learned) captured by the score_mod, the causal mask as a block mask
so that blocks above the diagonal are skipped, as the Pallas kernel skips them.
"""

import math
import statistics
import time

import numpy as np

from transformer.positions.alibi import alibi_slopes

TERMS = ('none', 'alibi', 't5')
NUM_BUCKETS, MAX_DISTANCE = 32, 128  # T5's defaults, causal: every bucket for the past


def t5_causal_bucket(relative, torch):
  """transformer.positions.t5.t5_bucket (bidirectional=False) in PyTorch ops, on the kernel's index tensors."""
  distance = torch.clamp(-relative, min=0)
  num_exact = NUM_BUCKETS // 2
  log_ratio = torch.log(torch.clamp(distance, min=1).float() / num_exact) / math.log(MAX_DISTANCE / num_exact)
  log_bucket = torch.clamp(num_exact + (log_ratio * (NUM_BUCKETS - num_exact)).to(torch.int32), max=NUM_BUCKETS - 1)
  return torch.where(distance < num_exact, distance.to(torch.int32), log_bucket)


def inputs(batch: int, length: int, heads: int, head_dim: int, seed: int = 0) -> dict:
  """The same numbers for both libraries: queries, keys, values (B x L x H x K) and T5's table (N x H)."""
  rng = np.random.default_rng(seed)
  return dict(query=rng.normal(size=(batch, length, heads, head_dim)).astype(np.float32),
              key=rng.normal(size=(batch, length, heads, head_dim)).astype(np.float32),
              value=rng.normal(size=(batch, length, heads, head_dim)).astype(np.float32),
              table=(0.1 * rng.normal(size=(NUM_BUCKETS, heads))).astype(np.float32))


def flex_attention_call(term: str, arrays: dict, dtype: str, device=None, backward: bool = True):
  """(run, tensors): run() does one forward (and backward: FlexAttention has none on CPUs) and returns the
  output, B x L x H x K."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch.nn.attention import flex_attention as flex  # pylint: disable=g-import-not-at-top
  device = device or torch.device('cuda' if torch.cuda.is_available() else 'cpu')
  torch_dtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16}[dtype]

  def tensor(name):  # B x L x H x K -> B x H x L x K, as FlexAttention takes them
    return torch.tensor(arrays[name], device=device).transpose(1, 2).contiguous().to(torch_dtype).requires_grad_(
        backward)
  query, key, value = tensor('query'), tensor('key'), tensor('value')
  batch, heads, length, _ = query.shape
  slopes = torch.tensor(alibi_slopes(heads), device=device)
  table = torch.tensor(arrays['table'], device=device).t().contiguous().requires_grad_(backward)  # H x N

  def score_mod(score, b, h, q_index, k_index):
    del b
    if term == 'alibi':
      return score - slopes[h] * (q_index - k_index)
    if term == 't5':
      return score + table[h, t5_causal_bucket(k_index - q_index, torch)]
    return score

  def causal(b, h, q_index, k_index):
    del b, h
    return q_index >= k_index

  block_mask = flex.create_block_mask(causal, B=None, H=None, Q_LEN=length, KV_LEN=length, device=str(device))
  compiled = torch.compile(flex.flex_attention)

  def run():
    for t in (query, key, value, table):
      t.grad = None
    out = compiled(query, key, value, score_mod=score_mod, block_mask=block_mask)
    if backward:
      (out.float() ** 2).sum().backward()
    if device.type == 'cuda':
      torch.cuda.synchronize()
    return out.detach().transpose(1, 2).float().cpu().numpy()
  return run, dict(query=query, key=key, value=value, table=table)


def run_flex_row(term: str, batch: int, length: int, heads: int, head_dim: int, repeats: int, dtype: str) -> dict:
  """Median seconds of FlexAttention's forward and backward with the term, as a row of the attention table."""
  import torch  # pylint: disable=g-import-not-at-top
  if term not in TERMS:
    raise ValueError(f'--flex: term {term!r}; valid: {", ".join(TERMS)}')
  run, _ = flex_attention_call(term, inputs(batch, length, heads, head_dim), dtype,
                               backward=torch.cuda.is_available())
  start = time.perf_counter()
  run()  # compiles
  compile_seconds = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return dict(term=f'{term} (FlexAttention{"" if torch.cuda.is_available() else ", forward only"})',
              seconds_median=statistics.median(times), compile_seconds=compile_seconds, torch_version=torch.__version__)
