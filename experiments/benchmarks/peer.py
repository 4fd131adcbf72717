"""The same benchmark row on x-transformers (PyTorch), the yardstick of `python -m experiments.benchmark --peer`.

An optional extra, never imported by the library or the training code: `pip install -e '.[peer]'`
(on a CPU-only machine install PyTorch's CPU build first, or pip takes a CUDA build of several GB).
The model is ours at the benchmark's config, as far as x-transformers can express it: a pre-norm
decoder-only LM of the same width, depth, heads and feed-forward size, with heads of model_dim /
num_heads (x-transformers defaults to 64), rotary embeddings over the whole head (its default is
half), a ReLU feed-forward (its default is GELU), the output projection tied to the input
embedding, and a final norm; one AdamW step per row, float32 or, with compute_dtype bfloat16, under
torch.autocast (parameters float32, matmuls bfloat16, as ours), timed the same way (median of the timed
steps after warm-up). What still differs is in `DIFFERENCES`, printed beside the table.
"""

import importlib.metadata
import os
import resource
import statistics
import time

# Our variant -> x-transformers keyword arguments (wrapper, attention layers). Variants it lacks
# (Shaw, TUPE) are not compared. Its sinusoidal embedding carries a learned scale (scaled_sinu_pos_emb).
PEER_VARIANTS = {
    'none': (dict(use_abs_pos_emb=False), {}),
    'learned': (dict(use_abs_pos_emb=True), {}),
    'sinusoidal': (dict(use_abs_pos_emb=True, scaled_sinu_pos_emb=True), {}),
    'rope': (dict(use_abs_pos_emb=False), dict(rotary_pos_emb=True)),
    'alibi': (dict(use_abs_pos_emb=False), dict(alibi_pos_bias=True)),
    't5': (dict(use_abs_pos_emb=False), dict(rel_pos_bias=True)),
}
# x-transformers refuses its fused attention with T5's bias, so T5 is compared unfused.
PEER_UNFUSABLE = ('t5',)
# What x-transformers cannot be told to do as ours does (a few thousand FLOPs a token at most).
DIFFERENCES = ('x-transformers has no biases in the attention projections and none in its layer norms; ours '
               'has both', 'ours multiplies the token embeddings by sqrt(model_dim); x-transformers does not',
               "x-transformers' sinusoidal embedding carries a learned scale")

INSTALL_HINT = ("--peer needs PyTorch and x-transformers: pip install -e '.[peer]' (on a CPU-only machine "
                "install PyTorch's CPU build first)")


def peer_available() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
    import x_transformers  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def build_peer_model(variant: str, max_length: int, *, fused: bool, vocab_size: int, model_dim: int, num_layers: int,
                     num_heads: int, feed_forward_dim: int):
  """Our benchmark model in x-transformers: heads of model_dim / num_heads, rotary over the whole head,
  ReLU, tied embeddings."""
  import torch  # pylint: disable=g-import-not-at-top
  import x_transformers  # pylint: disable=g-import-not-at-top
  wrapper_kwargs, layer_kwargs = PEER_VARIANTS[variant]
  head_dim = model_dim // num_heads
  return x_transformers.TransformerWrapper(
      num_tokens=vocab_size, max_seq_len=max_length, tie_embedding=True, **wrapper_kwargs,
      attn_layers=x_transformers.Decoder(
          dim=model_dim, depth=num_layers, heads=num_heads, attn_dim_head=head_dim, rotary_emb_dim=head_dim,
          ff_mult=feed_forward_dim // model_dim, ff_custom_activation=torch.nn.ReLU(), attn_flash=fused,
          **layer_kwargs))


def run_peer_row(variant: str, length: int, batch: int, steps: int, warmup: int, *, fused: bool,
                 vocab_size: int, model_dim: int, num_layers: int, num_heads: int, feed_forward_dim: int,
                 compute_dtype: str = 'float32') -> dict:
  """One training-step timing of x-transformers; the keys match `experiments.benchmarks.step.run_row`."""
  import torch  # pylint: disable=g-import-not-at-top
  import x_transformers  # pylint: disable=g-import-not-at-top
  if variant not in PEER_VARIANTS:
    raise ValueError(f'--peer: variant {variant!r} has no x-transformers counterpart; valid: {", ".join(PEER_VARIANTS)}')
  if feed_forward_dim % model_dim:
    raise ValueError(f'--peer: feed_forward_dim {feed_forward_dim} must be a multiple of model_dim {model_dim}')
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
  model = build_peer_model(variant, max(length, 512), fused=fused, vocab_size=vocab_size, model_dim=model_dim,
                           num_layers=num_layers, num_heads=num_heads, feed_forward_dim=feed_forward_dim).to(device)
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
  tokens = torch.randint(0, vocab_size, (batch, length + 1), device=device)
  synchronize = torch.cuda.synchronize if device.type == 'cuda' else lambda: None

  half = compute_dtype == 'bfloat16'

  def step():
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
      logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab_size), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    synchronize()
    return loss

  start = time.perf_counter()
  step()  # PyTorch has no compile step; the first step stands in for it
  first_step_seconds = time.perf_counter() - start
  for _ in range(warmup):
    step()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - start)
  median = statistics.median(times)
  count = sum(p.numel() for p in model.parameters())
  return dict(variant=variant, length=length, batch=batch, parameters=count, compile_seconds=first_step_seconds,
              step_seconds_median=median, step_seconds_min=min(times), step_seconds_max=max(times),
              tokens_per_second=batch * length / median,
              peak_memory_bytes=(torch.cuda.max_memory_allocated() if device.type == 'cuda'
                                 else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
              memory_kind='device' if device.type == 'cuda' else 'resident (CPU)', device=str(device),
              loss=float(loss.detach()), torch_version=torch.__version__,
              implementation=f'x-transformers {importlib.metadata.version("x-transformers")}'
                             f'{" attn_flash" if fused else ""}')
