"""Context extension of rotary encodings: run a model trained at length L on longer inputs by changing its
rotation frequencies theta_p (and, for YaRN, the attention temperature), without new parameters.

With s the factor and r_p = L theta_p / (2 pi) the number of rotations pair p makes over the original
length L (the YaRN paper's r(d) = L / lambda_d):
  pi           linear position interpolation (Chen et al. 2023): theta_p / s, i.e. positions m / s.
  ntk          NTK-aware scaling (bloc97 2023): base' = base s^(d / (d - 2)), d the rotated dimensions,
               so the lowest frequency becomes exactly theta_min / s and the highest stays. Written on the
               frequencies, theta_p' = theta_p s^(-ln theta_p / ln theta_min), which is that for RoPE and
               keeps "the lowest rotated frequency / s" for partial rotations.
  dynamic_ntk  ntk with s = max(1, l / L), l the length of the input so far (the YaRN paper's form; the
               one of Hugging Face's transformers, base (s l / L - s + 1)^(d / (d - 2)), is not this), taken
               per query: query i rotates itself and every key it reads with s_i = max(1, (i + 1) / L), the
               factor a decoder generating token i + 1 uses. Then position i's output depends on its prefix
               alone, and cached decoding (keys kept unrotated, rotated with each new query's factor, as the
               YaRN paper prescribes) equals the full pass at every position: with one factor per call, a
               cache would hold deeper layers' keys computed with older factors than the full pass's.
               Inputs up to L are RoPE; a shorter input scales back down. Computed as a logits term on
               unrotated queries and keys (dynamic_ntk_logits), one pair at a time inside each block.
  dynamic_ntk_sequence
               Hugging Face's 'dynamic': ntk with one factor for the whole sequence from its length l,
               s' = s max(l, L) / L - (s - 1) (base' = base s'^(d / (d - 2))), so RoPE up to L and s' growing
               with l beyond it (s' = l / L at s = 1). l is a full pass's 1 + largest position of a real token,
               or the cache's capacity when decoding (as longrope_by_length): a cached decoding rotates every
               token as the full pass over its capacity does (Hugging Face rescales at the length reached so
               far and keeps the keys it rotated before). Every position depends on the sequence's length.
  yarn         YaRN (Peng et al. 2023): theta_p' = (1 - g_p) theta_p / s + g_p theta_p with the ramp
               g_p = clip((r_p - alpha) / (beta - alpha), 0, 1), alpha = 1, beta = 32: pairs that turn
               fewer than alpha times over L are interpolated, more than beta times kept. The ramp is the
               paper's, continuous in r_p. With yarn_ramp=dimensions the ramp is the reference code's (and
               Hugging Face's): linear in the pair index p between the pairs that turn beta and alpha times,
               p(r) = ln(L / (2 pi r)) / ln(1 / theta_1), those two rounded outward (exact_dimensions: not
               rounded), the upper one at most 2P - 1. Queries and keys are both multiplied by 0.1 ln s + 1
               (the paper's sqrt(1/t); yarn_attention_factor sets another), so the logits grow by its square.
  llama3       the frequency bands of Llama 3.1 (Meta 2024): the same blend with the ramp between
               r = low_frequency_factor (1) and r = high_frequency_factor (4) rotations over L, and no
               temperature.
  longrope     LongRoPE (Ding et al. 2024), as Hugging Face's rope_type 'longrope' (Phi-3) computes it:
               theta_p' = theta_p / lambda_p with a rescale factor per pair, found by the paper's search,
               from the long set where the model serves beyond L (s > 1) and the short set otherwise;
               queries and keys both multiplied by the attention factor, by default
               sqrt(1 + ln s / ln L) (1 at s = 1). By default the run's factor picks the set. With
               longrope_by_length the length of the sequence served picks it, as Hugging Face does: the
               long set once it passes L, the short one up to L, the attention factor s's either way.
               That length is a full pass's 1 + largest position of a real token (padding excluded),
               or the cache's capacity when decoding, so a cached decoding rotates every token as the
               full pass over its capacity does (Hugging Face switches at the length reached so far and
               keeps the keys it rotated before). With longrope_keep_first = n (the paper's n-hat, which
               Hugging Face does not have) positions below n rotate as trained, theta_p and no attention
               factor, as the authors' code swaps in RoPE's own cos and sin there. The factors are settings
               (experiments read them from a Hugging Face config).
At s = 1 every method but longrope is RoPE exactly. Angles stay float32 (rope.rotate_by) whatever the compute dtype.
"""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp

from transformer.positions.base import Settings, require

METHODS = ('none', 'pi', 'ntk', 'dynamic_ntk', 'dynamic_ntk_sequence', 'yarn', 'llama3', 'longrope')
READS_ORIGINAL_LENGTH = ('dynamic_ntk', 'dynamic_ntk_sequence', 'yarn', 'llama3', 'longrope')
YARN_RAMPS = ('rotations', 'dimensions', 'exact_dimensions')


def factor_list(text: str) -> tuple[float, ...]:
  """'1.0 1.25 3.5' -> (1.0, 1.25, 3.5): LongRoPE's factors as a setting holds them (numbers separated by
  spaces or commas); ValueError on anything else."""
  return tuple(float(item) for item in text.replace(',', ' ').split())


@dataclasses.dataclass(frozen=True)
class ExtensionSettings(Settings):
  """The extension fields of every rotary variant (model.position.<field>)."""
  rope_extension: str = 'none'               # none, pi, ntk, dynamic_ntk(_sequence), yarn, llama3, longrope
  extension_factor: float = 1.0              # s: positions m / s (pi); dynamic_ntk reads s from the length
  original_length: int = 0                   # L, the length trained at: dynamic_ntk, yarn and llama3 read it
  yarn_alpha: float = 1.0                    # YaRN: pairs turning < alpha times over L are interpolated
  yarn_beta: float = 32.0                    # YaRN: pairs turning > beta times over L are kept
  yarn_ramp: str = 'rotations'               # YaRN: the blend linear in rotations (the paper), or in the pair index
  #                                            between rounded bounds (dimensions: the reference code, Hugging
  #                                            Face) or unrounded ones (exact_dimensions)
  yarn_attention_factor: float = 0.0         # YaRN: queries' and keys' factor; 0: 0.1 ln s + 1
  llama3_low_frequency_factor: float = 1.0   # Llama 3: pairs turning < this many times over L are interpolated
  llama3_high_frequency_factor: float = 4.0  # Llama 3: pairs turning > this many times over L are kept
  longrope_short_factors: str = ''           # LongRoPE: lambda_p of each pair, head_dim / 2 numbers, used at s = 1
  longrope_long_factors: str = ''            # LongRoPE: lambda_p of each pair, used at s > 1
  longrope_attention_factor: float = 0.0     # LongRoPE: queries' and keys' factor; 0: sqrt(1 + ln s / ln L)
  longrope_by_length: bool = False           # LongRoPE: the set by the sequence's length against L, not by s
  longrope_keep_first: int = 0               # LongRoPE: the paper's n-hat, the first positions rotated as trained

  def check(self):
    require(self.rope_extension in METHODS, 'position.rope_extension', self.rope_extension, ', '.join(METHODS))
    require(math.isfinite(self.extension_factor) and self.extension_factor >= 1.0, 'position.extension_factor',
            self.extension_factor, 'a finite number >= 1 (the new length over the original one)')
    require(self.rope_extension != 'dynamic_ntk' or self.extension_factor == 1.0, 'position.extension_factor',
            self.extension_factor, '1 with dynamic_ntk, which computes its factor from each input\'s length')
    require(self.original_length >= 0, 'position.original_length', self.original_length, 'an integer >= 0')
    require(self.rope_extension not in READS_ORIGINAL_LENGTH or self.original_length > 0, 'position.original_length',
            self.original_length, f'the training length (> 0) with rope_extension={self.rope_extension}')
    require(0.0 <= self.yarn_alpha < self.yarn_beta, 'position.yarn_alpha', self.yarn_alpha,
            f'a number >= 0 below yarn_beta={self.yarn_beta}')
    require(self.yarn_ramp in YARN_RAMPS, 'position.yarn_ramp', self.yarn_ramp, ', '.join(YARN_RAMPS))
    require(math.isfinite(self.yarn_attention_factor) and self.yarn_attention_factor >= 0,
            'position.yarn_attention_factor', self.yarn_attention_factor, 'a finite number > 0, or 0 for 0.1 ln s + 1')
    require(0.0 <= self.llama3_low_frequency_factor < self.llama3_high_frequency_factor,
            'position.llama3_low_frequency_factor', self.llama3_low_frequency_factor,
            f'a number >= 0 below llama3_high_frequency_factor={self.llama3_high_frequency_factor}')
    for field in ('longrope_short_factors', 'longrope_long_factors'):
      text = getattr(self, field)
      try:
        factors = factor_list(text)
      except ValueError:
        factors = ()
      require(isinstance(text, str) and (text.strip() == '' or (factors and all(
          math.isfinite(f) and f > 0 for f in factors))), f'position.{field}', text,
              'numbers > 0 separated by spaces, one per pair of dimensions (head_dim / 2), or empty')
      require(self.rope_extension != 'longrope' or factors, f'position.{field}', text,
              'the rescale factor of each pair (head_dim / 2 numbers) with rope_extension=longrope')
    require(self.rope_extension != 'longrope' or self.original_length > 1, 'position.original_length',
            self.original_length, 'the training length (> 1) with rope_extension=longrope, whose attention factor '
            'divides by its logarithm')
    require(math.isfinite(self.longrope_attention_factor) and self.longrope_attention_factor >= 0,
            'position.longrope_attention_factor', self.longrope_attention_factor,
            'a finite number > 0, or 0 for sqrt(1 + ln s / ln L)')
    require(isinstance(self.longrope_by_length, bool), 'position.longrope_by_length', self.longrope_by_length,
            'true or false')
    require(isinstance(self.longrope_keep_first, int) and not isinstance(self.longrope_keep_first, bool)
            and self.longrope_keep_first >= 0, 'position.longrope_keep_first', self.longrope_keep_first,
            'an integer >= 0, the first positions rotated as trained (0: none)')

  def check_attention(self, num_heads, head_dim, causal):
    if self.rope_extension == 'longrope':
      for field in ('longrope_short_factors', 'longrope_long_factors'):
        count = len(factor_list(getattr(self, field)))
        require(count == head_dim // 2, f'position.{field}', f'{count} numbers',
                f'{head_dim // 2}, one per pair of dimensions of a head of width {head_dim}')

  def reads_sequence_length(self) -> bool:
    """Whether the frequencies depend on the length of the sequence served: LongRoPE's set with
    longrope_by_length, dynamic_ntk_sequence's factor."""
    return (self.rope_extension == 'longrope' and self.longrope_by_length) or (
        self.rope_extension == 'dynamic_ntk_sequence')

  def longrope_keeps_first(self) -> int:
    """How many first positions LongRoPE leaves rotated as trained (longrope_keep_first; 0 for other methods)."""
    return self.longrope_keep_first if self.rope_extension == 'longrope' else 0

  def per_query(self) -> bool:
    """Whether each query has its own frequencies (dynamic_ntk): the rotation is then a logits term."""
    return self.rope_extension == 'dynamic_ntk'


def rotations_over(theta_P: chex.Array, original_length: int) -> chex.Array:
  """r_p = L theta_p / (2 pi): how many turns pair p makes over the original length (0 for an unrotated pair)."""
  return original_length * theta_P / (2.0 * math.pi)


def ntk_frequencies(theta_P: chex.Array, factor) -> chex.Array:
  """theta_p s^(-ln theta_p / ln theta_min), theta_min the lowest nonzero frequency; factor a scalar or
  B x 1. Unrotated pairs (theta 0) stay 0; at s = 1 exactly theta. Where every rotated pair has frequency
  1 (one pair), the lowest is that one: theta / s."""
  rotated_P = theta_P > 0
  log_theta_P = jnp.log(jnp.where(rotated_P, theta_P, 1.0))
  log_lowest = jnp.min(log_theta_P)
  ratio_P = jnp.where(log_lowest < 0, log_theta_P / jnp.minimum(log_lowest, -1.0e-30), 1.0)
  exponent_P = jnp.where(rotated_P, ratio_P, 0.0)
  return theta_P * jnp.exp(-exponent_P * jnp.log(jnp.asarray(factor, jnp.float32)))


def ramp_frequencies(theta_P: chex.Array, factor: float, original_length: int, lower: float,
                     upper: float) -> chex.Array:
  """(1 - g) theta / s + g theta, g = clip((r - lower) / (upper - lower), 0, 1): YaRN's and Llama 3's blend."""
  ramp_P = jnp.clip((rotations_over(theta_P, original_length) - lower) / (upper - lower), 0.0, 1.0)
  return (1.0 - ramp_P) * theta_P / factor + ramp_P * theta_P


def index_ramp_frequencies(theta_P: chex.Array, factor: float, original_length: int, lower: float, upper: float,
                           rounded: bool) -> chex.Array:
  """YaRN's blend with the ramp linear in the pair index p (Peng et al.'s code, Hugging Face's 'yarn'): from the
  pair turning `upper` times over L (kept below it) to the one turning `lower` times (interpolated beyond it),
  p(r) = ln(L / (2 pi r)) / ln(1 / theta_1), rounded outward when `rounded`."""
  pairs = theta_P.shape[0]
  if pairs < 2:
    return ramp_frequencies(theta_P, factor, original_length, lower, upper)
  step = -jnp.log(theta_P[1])

  def pair_turning(rotations):
    return jnp.log(original_length / (2.0 * math.pi * rotations)) / step
  first, last = pair_turning(upper), pair_turning(lower)
  if rounded:
    first, last = jnp.floor(first), jnp.ceil(last)
  first, last = jnp.maximum(first, 0.0), jnp.minimum(last, 2 * pairs - 1.0)
  last = jnp.where(first == last, last + 0.001, last)
  kept_P = 1.0 - jnp.clip((jnp.arange(pairs, dtype=jnp.float32) - first) / (last - first), 0.0, 1.0)
  return (1.0 - kept_P) * theta_P / factor + kept_P * theta_P


def yarn_magnitude(factor: float) -> float:
  """0.1 ln s + 1, YaRN's sqrt(1/t): what queries and keys are both multiplied by."""
  return 0.1 * math.log(factor) + 1.0


def extended_frequencies(theta_P: chex.Array, settings: ExtensionSettings, sequence_length=None):
  """(theta', magnitude) of a static method: the frequencies and the factor on queries and keys.
  sequence_length: the length of the sequence served (an int, or a traced scalar), which LongRoPE's set
  reads with longrope_by_length; None: s L, the length the factor names."""
  method, factor = settings.rope_extension, settings.extension_factor
  if method == 'longrope':
    return longrope_frequencies(theta_P, settings, sequence_length)
  if method == 'dynamic_ntk_sequence':
    return ntk_frequencies(theta_P, sequence_factor(factor, settings.original_length, sequence_length)), 1.0
  if method == 'none' or factor == 1.0:
    return theta_P, 1.0
  if method == 'pi':
    return theta_P / factor, 1.0
  if method == 'ntk':
    return ntk_frequencies(theta_P, factor), 1.0
  if method == 'yarn':
    magnitude = settings.yarn_attention_factor or yarn_magnitude(factor)
    if settings.yarn_ramp == 'rotations':
      return (ramp_frequencies(theta_P, factor, settings.original_length, settings.yarn_alpha, settings.yarn_beta),
              magnitude)
    return (index_ramp_frequencies(theta_P, factor, settings.original_length, settings.yarn_alpha,
                                   settings.yarn_beta, rounded=settings.yarn_ramp == 'dimensions'), magnitude)
  if method == 'llama3':
    return ramp_frequencies(theta_P, factor, settings.original_length, settings.llama3_low_frequency_factor,
                            settings.llama3_high_frequency_factor), 1.0
  raise ValueError(f'position.rope_extension: got {method!r}; valid: pi, ntk, dynamic_ntk_sequence, yarn, llama3, '
                   'longrope (the methods of one set of frequencies per sequence)')


def sequence_factor(factor: float, original_length: int, sequence_length=None):
  """s max(l, L) / L - (s - 1): dynamic_ntk_sequence's factor for a sequence of length l (an int or a traced
  scalar; None: s L, the length s names)."""
  length = factor * original_length if sequence_length is None else sequence_length
  return factor * jnp.maximum(jnp.asarray(length, jnp.float32), original_length) / original_length - (factor - 1.0)


def longrope_frequencies(theta_P: chex.Array, settings: ExtensionSettings, sequence_length=None):
  """(theta_p / lambda_p, attention factor): the long set for s > 1 (with longrope_by_length: for a
  sequence longer than L), else the short set; the attention factor sqrt(1 + ln s / ln L) for s > 1, else 1, or
  the setting's."""
  factor, original = settings.extension_factor, settings.original_length
  short_P, long_P = (jnp.asarray(factor_list(text), jnp.float32)
                     for text in (settings.longrope_short_factors, settings.longrope_long_factors))
  chex.assert_equal_shape([short_P, long_P, theta_P])
  if not settings.longrope_by_length:
    rescale_P = long_P if factor > 1.0 else short_P
  elif sequence_length is None or isinstance(sequence_length, int):
    rescale_P = long_P if (factor * original if sequence_length is None else sequence_length) > original else short_P
  else:
    rescale_P = jnp.where(sequence_length > original, long_P, short_P)
  magnitude = settings.longrope_attention_factor or (
      math.sqrt(1.0 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0)
  return theta_P / rescale_P, magnitude


def dynamic_factor(q_positions_BxLq: chex.Array, original_length: int) -> chex.Array:
  """s_i = max(1, (pos_i + 1) / L): the length of query i's prefix over the original length, B x Lq."""
  return jnp.maximum(1.0, (q_positions_BxLq.astype(jnp.float32) + 1.0) / original_length)


def dynamic_ntk_logits(query_BxLqxHxK: chex.Array, key_BxLkxGxK: chex.Array, q_positions_BxLq: chex.Array,
                       k_positions_BxLk: chex.Array, theta_P: chex.Array, original_length: int,
                       scale: float) -> chex.Array:
  """scale (q_i^T R((pos_j - pos_i) theta(s_i)) k_j - q_i . k_j), B x H x Lq x Lk, for unrotated q and k:
  added to the plain logits q.k scale, the logits of dynamic NTK with query i's own factor s_i
  (ntk_frequencies). Per pair, with w = (q_e k_e + q_o k_o) + i (q_o k_e - q_e k_o), the rotated product is
  Re(w e^(i (pos_i - pos_j) theta)). Blockwise attention computes it a block of queries at a time. Query head h
  reads key head h // (H / G): the query heads of a group are one axis against their key head's pairs."""
  chex.assert_rank([query_BxLqxHxK, key_BxLkxGxK], 4)
  theta_BxLqxP = ntk_frequencies(theta_P, dynamic_factor(q_positions_BxLq, original_length)[..., None])
  distance_BxLqxLk = (q_positions_BxLq[:, :, None] - k_positions_BxLk[:, None, :]).astype(jnp.float32)
  batch, length_q, heads, head_dim = query_BxLqxHxK.shape
  length_k, groups = key_BxLkxGxK.shape[1], key_BxLkxGxK.shape[2]

  def pairs(x_BxLxGxK, group_size):  # B x G x group_size x L x P, even and odd features
    rows = jnp.transpose(x_BxLxGxK.astype(jnp.float32), (0, 2, 1, 3)).reshape(
        batch, groups, group_size, x_BxLxGxK.shape[1], head_dim // 2, 2)
    return rows[..., 0], rows[..., 1]

  (q_even, q_odd), (k_even, k_odd) = pairs(query_BxLqxHxK, heads // groups), pairs(key_BxLkxGxK, 1)

  def add_pair(total, pair):  # one pair's term at a time: B x H x Lq x Lk x P at once would not fit at long lengths
    theta_BxLq, q_even_p, q_odd_p, k_even_p, k_odd_p = pair
    angle_Bx1x1xLqxLk = (distance_BxLqxLk * theta_BxLq[:, :, None])[:, None, None]
    q_even_p, q_odd_p = q_even_p[..., None], q_odd_p[..., None]  # against every key
    k_even_p, k_odd_p = k_even_p[..., None, :], k_odd_p[..., None, :]  # for every query
    real = q_even_p * k_even_p + q_odd_p * k_odd_p
    imaginary = q_odd_p * k_even_p - q_even_p * k_odd_p
    return total + (real * jnp.cos(angle_Bx1x1xLqxLk) - imaginary * jnp.sin(angle_Bx1x1xLqxLk) - real), None

  by_pair = [jnp.moveaxis(x, -1, 0) for x in (theta_BxLqxP, q_even, q_odd, k_even, k_odd)]
  total = jnp.zeros((batch, groups, heads // groups, length_q, length_k), jnp.float32)
  total, _ = jax.lax.scan(add_pair, total, by_pair)
  term_BxHxLqxLk = scale * total.reshape(batch, heads, length_q, length_k)
  return term_BxHxLqxLk
