"""The choice of attention core (transformer/attention_core.py): the rules for 'auto', explicit choices
taken or refused naming the field, and the cores giving the explicit softmax's outputs in a model."""

import dataclasses
import itertools
import re

import jax.numpy as jnp
import numpy as np
import pytest

import transformer as T
from transformer import attention_core
from tests.helpers import init, tiny, tokens


def _needs(backend='cpu', dtype='float32', caller_weights=False, values_term=False, position_term=False,
           blocks_configured=True, blocks_pay=True, kernel_serves=True, mask_in_parts=True, softmax=True,
           softcap=False, sinks=False):
  return attention_core.CallNeeds(backend, dtype, caller_weights, values_term, position_term, blocks_configured,
                                  blocks_pay, kernel_serves, mask_in_parts, softmax, softcap, sinks)


@pytest.mark.parametrize('needs, expected', [
    (_needs(), 'blockwise'),                                         # CPU, long causal: blocks
    (_needs(blocks_pay=False), 'explicit'),                          # CPU, short: one softmax
    (_needs(blocks_configured=False), 'explicit'),
    (_needs(values_term=True), 'blockwise'),                         # Shaw in blocks
    (_needs(caller_weights=True), 'explicit'),                       # dropout / collected weights
    (_needs(backend='tpu', blocks_pay=False), 'explicit'),
    (_needs(backend='gpu'), 'blockwise'),                            # float32 on a GPU: blocks first
    (_needs(backend='gpu', blocks_pay=False), 'xla'),
    (_needs(backend='gpu', dtype='bfloat16'), 'cudnn'),              # half precision, nothing added
    (_needs(backend='gpu', dtype='float16', blocks_pay=False), 'cudnn'),
    (_needs(backend='gpu', dtype='bfloat16', position_term=True), 'blockwise'),   # ALiBi, T5: not cuDNN
    (_needs(backend='gpu', dtype='bfloat16', position_term=True, blocks_pay=False), 'xla'),
    (_needs(backend='gpu', dtype='bfloat16', values_term=True, blocks_pay=False), 'explicit'),
    (_needs(backend='gpu', dtype='bfloat16', caller_weights=True), 'explicit'),
    (_needs(backend='gpu', dtype='bfloat16', softmax=False), 'blockwise'),       # stick-breaking: its own blocks
    (_needs(backend='gpu', dtype='bfloat16', softmax=False, blocks_pay=False), 'explicit'),
])
def test_auto_picks_by_backend_dtype_and_what_the_call_needs(needs, expected):
  assert attention_core.choose('auto', needs) == expected


def _every_call():
  """Every combination of what a call may need, on each backend and dtype."""
  flags = [field.name for field in dataclasses.fields(attention_core.CallNeeds) if field.type in (bool, 'bool')]
  for backend, dtype in itertools.product(('cpu', 'gpu', 'tpu'), ('float32', 'bfloat16', 'float16')):
    for values in itertools.product((False, True), repeat=len(flags)):
      yield attention_core.CallNeeds(backend=backend, dtype=dtype, **dict(zip(flags, values)))


def test_the_docstring_table_lists_autos_rules_in_the_order_the_code_tries_them():
  table = re.findall(r'^  \| (\w+) +\|', attention_core.__doc__, flags=re.MULTILINE)
  assert table[0] == 'core'
  assert table[1:] == [core for core, _ in attention_core.AUTO_RULES]


def test_auto_picks_the_first_rule_that_holds_and_only_a_core_that_can_run():
  """Over every combination of backend, dtype and the call's needs (9216 calls): auto's choice is a core
  that an explicit request for it would take, never pallas, and no earlier rule held."""
  calls = list(_every_call())
  assert len(calls) == 3 * 3 * 2 ** 10
  for needs in calls:
    core = attention_core.choose('auto', needs)
    assert core != 'pallas'
    assert attention_core.choose(core, needs) == core, needs
    earlier = [name for name, holds in attention_core.AUTO_RULES[:[n for n, _ in attention_core.AUTO_RULES].index(core)]
               if holds(needs)]
    assert not earlier, (needs, core, earlier)


@pytest.mark.parametrize('requested, needs', [
    ('explicit', _needs(backend='gpu', dtype='bfloat16')),
    ('blockwise', _needs(blocks_pay=False, values_term=True)),
    ('xla', _needs()),
    ('cudnn', _needs(backend='gpu', dtype='bfloat16', blocks_pay=False)),
    ('pallas', _needs(backend='gpu', dtype='bfloat16', position_term=True)),   # ALiBi, T5, KERPLE in the kernel
    ('pallas', _needs(backend='tpu')),
    ('pallas', _needs()),                                                       # interpreted on a CPU
])
def test_an_explicit_choice_that_can_run_is_taken(requested, needs):
  assert attention_core.choose(requested, needs) == requested


@pytest.mark.parametrize('requested, needs, reason', [
    ('cudnn', _needs(), 'cuDNN runs on GPUs and this backend is cpu'),
    ('cudnn', _needs(backend='gpu'), 'bfloat16 or float16 and the compute dtype is float32'),
    ('cudnn', _needs(backend='gpu', dtype='bfloat16', position_term=True), 'adds a logits term'),
    ('xla', _needs(values_term=True), "Shaw's"),
    ('blockwise', _needs(blocks_configured=False), 'attention_block_size is 0'),
    ('blockwise', _needs(caller_weights=True), 'never form'),
    ('pallas', _needs(backend='gpu', kernel_serves=False), 'not one the kernel computes'),   # TUPE, FIRE, ...
    ('pallas', _needs(backend='gpu', mask_in_parts=False), 'not the causal mask, padding and documents given as such'),
    ('pallas', _needs(backend='gpu', caller_weights=True), 'never forms'),
    ('pallas', _needs(values_term=True), "Shaw's"),
    ('xla', _needs(softmax=False), 'weights are not a softmax'),
    ('cudnn', _needs(backend='gpu', dtype='bfloat16', softmax=False), 'weights are not a softmax'),
    ('pallas', _needs(softmax=False), 'weights are not a softmax'),
    ('flash', _needs(), 'valid: auto, explicit, blockwise, xla, cudnn, pallas'),
    ('xla', _needs(backend='gpu', softcap=True), 'soft-capped'),
    ('cudnn', _needs(backend='gpu', dtype='bfloat16', softcap=True), 'soft-capped'),
    ('cudnn', _needs(backend='gpu', dtype='bfloat16', sinks=True), 'a sink logit'),
])
def test_a_choice_that_cannot_run_is_refused_naming_the_field_and_why(requested, needs, reason):
  with pytest.raises(ValueError, match='model.attention_implementation') as error:
    attention_core.choose(requested, needs)
  assert reason in str(error.value)


def test_the_refusal_lists_what_would_run():
  with pytest.raises(ValueError, match=r'valid here: auto, explicit, blockwise, xla, pallas$'):
    attention_core.choose('cudnn', _needs())
  with pytest.raises(ValueError, match=r'valid here: auto, explicit, blockwise, xla$'):
    attention_core.choose('cudnn', _needs(kernel_serves=False))


@pytest.mark.parametrize('backend, dtype', [('gpu', 'bfloat16'), ('gpu', 'float32'), ('tpu', 'bfloat16'),
                                            ('cpu', 'float32')])
def test_auto_leaves_the_pallas_kernel_to_be_asked_for(backend, dtype):
  for position_term in (False, True):
    for blocks_pay in (False, True):
      needs = _needs(backend=backend, dtype=dtype, position_term=position_term, blocks_pay=blocks_pay)
      assert attention_core.choose('auto', needs) != 'pallas'


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['none', 'rope', 'alibi', 'shaw'])
def test_every_core_that_runs_on_this_machine_gives_the_explicit_outputs(kind):
  """A decoder of length 9 in blocks of 4: explicit, blockwise and (where no values term) XLA's fused call."""
  inputs = tokens(2, 9)
  outputs = {}
  for implementation in ('explicit', 'blockwise', 'xla', 'auto'):
    if implementation == 'xla' and kind == 'shaw':
      continue
    model = T.DecoderOnly(tiny(kind, attention_block_size=4, attention_implementation=implementation))
    params = init(T.DecoderOnly(tiny(kind)), inputs)
    outputs[implementation] = model.apply(params, inputs)
  for implementation, logits in outputs.items():
    np.testing.assert_allclose(logits, outputs['explicit'], atol=2e-5, rtol=1e-5, err_msg=implementation)


def test_a_model_asked_for_cudnn_on_this_cpu_refuses_when_traced():
  model = T.DecoderOnly(tiny('rope', attention_implementation='cudnn', compute_dtype='bfloat16'))
  with pytest.raises(ValueError, match='cuDNN runs on GPUs'):
    init(model, tokens(2, 5))


def test_an_unknown_implementation_is_refused_by_the_config():
  with pytest.raises(ValueError, match='attention_implementation'):
    tiny('rope', attention_implementation='flash')


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('valid_rows', [None, [[1] * 9, [1] * 6 + [0] * 3], [[1] * 9, [1, 1, 0, 1, 0] + [1] * 4]])
def test_the_fused_call_takes_the_mask_as_its_parts(causal, valid_rows):
  """is_causal and the keys' padding (as sequence lengths where it is at the end of each row, else a
  B x 1 x 1 x Lk mask: both branches) give the attention of the whole mask. (Every query sees a key: a row
  that sees none is zeros in the explicit core, a uniform average in the fused call.)"""
  rng = np.random.default_rng(0)
  query, key, value = (jnp.asarray(rng.normal(size=(2, 9, 3, 8)), jnp.float32) for _ in range(3))
  valid = None if valid_rows is None else jnp.asarray(valid_rows, bool)
  mask = T.masks.self_attention_mask(valid, 9, causal)
  expected = T.attention.scaled_dot_product_attention(query, key, value, mask=mask)
  got = T.attention.fused_attention(query, key, value, mask=mask, implementation='xla', mask_parts=(causal, valid, 0))
  np.testing.assert_allclose(got, expected, atol=1e-5)
