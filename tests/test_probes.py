"""The passkey: its prompts (experiments/tasks/passkey.py), their scoring against a model that copies the key
and one that cannot, the Wilson interval, the probe command (experiments/evaluation/probes.py), and the rows
task.passkey_fraction mixes into training."""

import json
import re
import sys

import numpy as np
import pytest

from configs import corpus as corpus_config
from experiments.evaluation import probes
from experiments.tasks import needles, passkey
from experiments.tasks import TASKS
from experiments.tasks.base import TaskSettings
from tests import command_server


def _task(name: str):
  return TASKS[name](TaskSettings(name=name, model_kind='decoder_only', vocab_size=0, min_length=1, max_length=64,
                                  eval_lengths=(64,), eval_batches=1,
                                  path=corpus_config.SHIPPED if name == 'corpus' else ''))


def _codec_and_stream(name: str):
  task = _task(name)
  return passkey.codec_for(task), task.stream('eval')


def _find(ids: list, part: list, last: bool = False) -> int:
  found = [i for i in range(len(ids) - len(part) + 1) if ids[i:i + len(part)] == part]
  return found[-1] if last else found[0]


def _rerun(next_logits):
  """The probe's decoder for a model given as next_logits(ids_BxL), a NumPy function of the whole prefix: greedy,
  the prefix rerun at every token."""
  def continuations(prompts_BxL, tokens):
    ids, written = np.asarray(prompts_BxL), []
    for _ in range(tokens):
      written.append(np.argmax(np.asarray(next_logits(ids)), axis=-1).astype(np.int32))
      ids = np.concatenate([ids, written[-1][:, None]], axis=1)
    return np.stack(written, axis=1)
  return continuations


def _copier(codec):
  """A model that copies: it finds "The pass key is" in its input and, for the k-th token after the
  question, writes the k-th token that follows it there."""
  marker, question = list(codec.encode('The pass key is')), list(codec.encode(passkey.QUESTION))

  def next_logits(ids_BxL):
    logits = np.zeros((len(ids_BxL), 100_000), np.float32)
    for row, ids in enumerate(ids_BxL.tolist()):
      written = len(ids) - (_find(ids, question, last=True) + len(question))
      logits[row, ids[_find(ids, marker) + len(marker) + written]] = 1.0
    return logits

  return next_logits


@pytest.mark.parametrize('name', ['shakespeare', 'corpus'])
@pytest.mark.parametrize('length', [128, 257])
def test_the_prompt_has_the_asked_length_and_the_needle_at_the_asked_depth(name, length):
  codec, stream = _codec_and_stream(name)
  key = passkey.passkey_key(0, 3)
  needle = list(codec.encode(passkey.NEEDLE.format(key=key)))
  question = list(codec.encode(passkey.QUESTION))
  room = length - 1 - len(needle) - len(question)
  starts = []
  for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
    filler = passkey.filler_for(codec, stream, passkey.filler_room(codec, length, key), 0, 3, classic=False)
    prompt = passkey.passkey_prompt(codec, filler, length, depth, key)
    ids = prompt.ids.tolist()
    assert len(ids) == length and ids[0] == codec.bos
    assert prompt.needle_start == 1 + round(depth * room)
    assert ids[prompt.needle_start:prompt.needle_start + len(needle)] == needle
    assert ids[-len(question):] == question
    without = ids[1:prompt.needle_start] + ids[prompt.needle_start + len(needle):-len(question)]
    assert without == filler.tolist()  # the filler, whole and in order, around the needle
    assert key in codec.decode(ids)
    starts.append(prompt.needle_start)
  assert starts[0] == 1 and starts[-1] + len(needle) == length - len(question)
  assert starts == sorted(starts)


def test_the_filler_is_held_out_text_or_the_classic_sentences():
  codec, stream = _codec_and_stream('shakespeare')
  drawn = passkey.filler_for(codec, stream, 50, 0, 1, classic=False)
  start = next(i for i in range(len(stream) - 50) if np.array_equal(stream[i:i + 50], drawn))
  assert np.array_equal(passkey.filler_for(codec, stream, 50, 0, 1, classic=False), drawn)  # a function of the trial
  assert not np.array_equal(passkey.filler_for(codec, stream, 50, 0, 2, classic=False), stream[start:start + 50])
  classic = codec.decode(passkey.filler_for(codec, stream, 200, 0, 1, classic=True).tolist())
  assert classic.startswith(passkey.CLASSIC_FILLER + passkey.CLASSIC_FILLER[:10])


@pytest.mark.parametrize('name', ['shakespeare', 'corpus'])
def test_a_model_that_copies_the_key_scores_one_and_one_that_cannot_scores_zero(name):
  codec, stream = _codec_and_stream(name)
  copier = _copier(codec)
  for depth in (0.0, 0.5, 1.0):
    cell = probes.probe_cell(codec, _rerun(copier), stream, 128, depth, trials=8, seed=0, batch_size=8)
    assert cell['correct'] == 8 and cell['rate'] == 1.0, cell['answers']
    assert cell['answers'] == [passkey.passkey_key(0, trial) for trial in range(8)]
    assert cell['low'] == pytest.approx(8 / (8 + 1.959964 ** 2), rel=1e-5) and cell['high'] == pytest.approx(1.0)
  zero = list(codec.encode('0'))[0]
  if name == 'shakespeare':  # one character per digit: a copy with its last digit wrong is wrong
    def almost(ids_BxL):
      logits = copier(ids_BxL)
      question = list(codec.encode(passkey.QUESTION))
      for row, ids in enumerate(ids_BxL.tolist()):
        if len(ids) - (_find(ids, question, last=True) + len(question)) == passkey.KEY_DIGITS:  # after ' ' + 4 digits
          last = codec.decode([int(np.argmax(logits[row]))])
          logits[row] = 0.0
          logits[row, list(codec.encode(str((int(last) + 1) % 10)))[0]] = 1.0
      return logits

    cell = probes.probe_cell(codec, _rerun(almost), stream, 128, 0.5, trials=8, seed=0)
    assert cell['correct'] == 0 and all(answer[:4] == passkey.passkey_key(0, trial)[:4]
                                        for trial, answer in enumerate(cell['answers']))

  def constant(ids_BxL):
    logits = np.zeros((len(ids_BxL), 100_000), np.float32)
    logits[:, zero] = 1.0
    return logits

  cell = probes.probe_cell(codec, _rerun(constant), stream, 128, 0.5, trials=8, seed=0)
  assert cell['correct'] == 0 and cell['rate'] == 0.0 and set(cell['answers']) == {'0' * (len(cell['answers'][0]))}
  assert cell['low'] == 0.0 and cell['high'] == pytest.approx(1.959964 ** 2 / (8 + 1.959964 ** 2), rel=1e-5)


def _needle_copier(codec, wrong: bool = False):
  """A model that reads the question's word and copies the number of that word's needle; with `wrong`, the
  number of the first needle in the prompt whatever its word."""
  question_start = list(codec.encode('What is the special number for'))

  def next_logits(ids_BxL):
    logits = np.zeros((len(ids_BxL), 100_000), np.float32)
    for row, ids in enumerate(ids_BxL.tolist()):
      start = _find(ids, question_start, last=True)
      word = re.match(r'What is the special number for (\w+)\?', codec.decode(ids[start:])).group(1)
      asked = needles.QUESTION.format(word=word)
      written = len(ids) - (_find(ids, list(codec.encode(asked)), last=True) + len(codec.encode(asked)))
      marker = list(codec.encode(needles.NEEDLE.format(word=word, value='').rstrip('. ').rstrip()))
      if wrong:
        first = re.search(r'The special number for (\w+) is', codec.decode(ids)).group(1)
        marker = list(codec.encode(needles.NEEDLE.format(word=first, value='').rstrip('. ').rstrip()))
      logits[row, ids[_find(ids, marker) + len(marker) + written]] = 1.0
    return logits

  return next_logits


@pytest.mark.parametrize('name', ['shakespeare', 'corpus'])
def test_needles_sit_where_asked_and_only_the_asked_ones_number_scores(name):
  codec, stream = _codec_and_stream(name)
  for depth in (0.0, 0.5, 1.0):
    for trial in range(4):
      pairs = needles.needle_pairs(0, trial, 4)
      assert len({word for word, _ in pairs}) == 4
      prompt = probes.probe_prompt('needle', codec, stream, 320, depth, 0, trial, needles=4)
      ids = prompt.ids.tolist()
      assert len(ids) == 320 and ids[0] == codec.bos and prompt.key == pairs[0][1]
      pieces = [list(codec.encode(needles.NEEDLE.format(word=w, value=v))) for w, v in pairs]
      starts = [_find(ids, piece) for piece in pieces]
      assert starts[0] == prompt.needle_start
      assert ids[-len(codec.encode(needles.QUESTION.format(word=pairs[0][0]))):] == list(
          codec.encode(needles.QUESTION.format(word=pairs[0][0])))
      room = needles.filler_room(codec, 320, pairs)
      other_tokens_before = sum(len(piece) for piece, start in zip(pieces[1:], starts[1:]) if start < starts[0])
      assert starts[0] - 1 - other_tokens_before == round(depth * room)
  right = probes.probe_cell(codec, _rerun(_needle_copier(codec)), stream, 320, 0.5, trials=8, seed=0, probe='needle')
  assert right['correct'] == 8 and right['rate'] == 1.0, right['answers']
  first_found = probes.probe_cell(codec, _rerun(_needle_copier(codec, wrong=True)), stream, 320, 1.0, trials=8, seed=0,
                                  probe='needle')
  asked_first = sum(probes.probe_prompt('needle', codec, stream, 320, 1.0, 0, trial).needle_start ==
                    min(_find(probes.probe_prompt('needle', codec, stream, 320, 1.0, 0, trial).ids.tolist(),
                              list(codec.encode(needles.NEEDLE.format(word=w, value=v))))
                        for w, v in needles.needle_pairs(0, trial, 4)) for trial in range(8))
  assert first_found['correct'] == asked_first < 8  # right only where the asked needle happens to come first


def test_a_needle_probe_that_cannot_be_built_is_refused_in_one_line():
  codec, _ = _codec_and_stream('shakespeare')
  for count in (0, len(needles.WORDS) + 1):
    with pytest.raises(passkey.ProbeError, match=rf'^--needles: got {count}; valid: 1 to {len(needles.WORDS)}$'):
      needles.needle_pairs(0, 0, count)
  with pytest.raises(passkey.ProbeError, match=r'^--lengths: got 120; valid: at least \d+ tokens, the first token, 4 '
                                              r'needles and the question$'):
    needles.filler_room(codec, 120, needles.needle_pairs(0, 0, 4))


@pytest.mark.parametrize('kind, position', [('rope', dict(rope_extension='dynamic_ntk', original_length=8)),
                                            ('alibi', {}), ('fox', {})])
def test_the_cached_decoder_writes_what_rerunning_the_whole_prefix_writes(kind, position):
  """The probes decode through the model's cache; a greedy decoder rerunning the whole prefix for each token
  writes the same tokens (dynamic NTK: the prompt is past the original length, each token with its factor)."""
  import jax  # pylint: disable=g-import-not-at-top
  import transformer as T  # pylint: disable=g-import-not-at-top
  from tests.helpers import init, tiny, tokens  # pylint: disable=g-import-not-at-top
  model = T.DecoderOnly(tiny(kind, position=position))
  prompts_BxL = np.asarray(tokens(4, 20, seed=4))
  params = jax.tree_util.tree_map(lambda x: 3 * x, init(model, prompts_BxL)['params'])  # continuations that vary

  def rerun(prompts_BxL, tokens):  # the whole buffer through the model for every token, no cache
    generated = jax.jit(lambda p, x: T.decoder_only_generate(model, {'params': p}, x, tokens, use_cache=False))(
        params, prompts_BxL)
    return np.asarray(generated[:, prompts_BxL.shape[1]:])

  decode = probes.cached_continuations(model, params, most_tokens=8)
  expected = rerun(prompts_BxL, 6)
  np.testing.assert_array_equal(decode(prompts_BxL, 6), expected)
  assert len({tuple(row) for row in expected.tolist()}) == 4 and all(len(set(row)) > 1 for row in expected.tolist())
  np.testing.assert_array_equal(decode(prompts_BxL, 3), expected[:, :3])  # the first tokens of the same decoding
  with pytest.raises(ValueError, match='an answer of 9 tokens; valid: at most 8'):
    decode(prompts_BxL, 9)


def test_the_wilson_interval_is_the_textbook_one():
  z = 1.959963984540054
  for correct, trials in ((5, 10), (1, 20), (19, 20)):
    p = correct / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    assert probes.wilson_interval(correct, trials) == pytest.approx((centre - half, centre + half), rel=1e-9)


def test_a_probe_that_cannot_be_built_is_refused_in_one_line():
  codec, stream = _codec_and_stream('shakespeare')
  with pytest.raises(passkey.ProbeError, match=r'^--lengths: got 40; valid: at least 97 tokens, the first token, '
                                              r'the needle and the question$'):
    passkey.filler_room(codec, 40, '12345')
  with pytest.raises(passkey.ProbeError, match=r'^--depths: got 1.5; valid: numbers in \[0, 1\]'):
    passkey.passkey_prompt(codec, stream[:200], 200, 1.5, '12345')
  with pytest.raises(passkey.ProbeError, match="lacks"):
    codec.encode('π')


def test_a_probe_the_run_cannot_serve_is_refused_before_anything_is_written(monkeypatch):
  """Lengths whose filler the held-out stream cannot give, and lengths whose decoding cache alone outgrows the
  device, are refused by the checks a probe runs before it creates its directory."""
  import transformer  # pylint: disable=g-import-not-at-top
  from experiments.runs import preflight  # pylint: disable=g-import-not-at-top
  codec, stream = _codec_and_stream('shakespeare')
  config = transformer.ModelConfig(vocab_size=70, model_dim=32, num_heads=2, feed_forward_dim=64, num_decoder_layers=2,
                                   position=transformer.PositionConfig('rope'))
  monkeypatch.setattr(preflight, 'device_memory', lambda: 2 ** 30)
  check = probes._refuse_lengths_the_run_cannot_take  # pylint: disable=protected-access
  request = probes.ProbeRequest(lengths=(200, len(stream) + 200), depths=(0.5,), trials=3)
  with pytest.raises(passkey.ProbeError, match=rf'^--lengths: {len(stream) + 200} needs \d+ filler tokens of a held-out '
                                              rf'stream of {len(stream)}; valid: .*--probe_filler=classic$'):
    check(request, config, codec, len(stream))
  needle = probes.ProbeRequest(lengths=(len(stream) + 200,), depths=(0.5,), trials=3, probe='needle', needles=2)
  with pytest.raises(passkey.ProbeError, match='held-out stream of'):
    check(needle, config, codec, len(stream))
  classic = probes.ProbeRequest(lengths=(200, len(stream) + 200), depths=(0.5,), trials=3, filler='classic')
  check(classic, config, codec, len(stream))  # the classic filler needs no stream; its cache fits
  cache_bytes = probes.decoding_bytes_at_least(config, 3, 2 ** 30 // (2 * 2 * 3 * 32 * 4) + 1)
  assert cache_bytes > 2 ** 30
  huge = probes.ProbeRequest(lengths=(2 ** 30 // (2 * 2 * 3 * 32 * 4),), depths=(0.5,), trials=3, filler='classic')
  with pytest.raises(ValueError, match=r'^--lengths: \d+ would cache at least 1.0 GiB of keys and values for 3 prompts, '
                                       r'more than the device\'s 1.0 GiB'):
    check(huge, config, codec, len(stream))


@pytest.mark.parametrize('compute_dtype, kv_heads', [('float32', 0), ('bfloat16', 0), ('float32', 1)])
def test_the_decoding_bound_is_the_cached_keys_and_values_and_no_more(compute_dtype, kv_heads):
  """decoding_bytes_at_least equals the bytes of the keys and values the model's cache holds (jax.eval_shape of
  the call that creates it), so it never refuses a probe that would fit; with one key and value head of three
  (multi-query attention) a third of them."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top
  config = transformer.ModelConfig(vocab_size=50, model_dim=24, num_heads=3, feed_forward_dim=32, num_decoder_layers=3,
                                   position=transformer.PositionConfig('rope'), compute_dtype=compute_dtype,
                                   num_kv_heads=kv_heads)
  model = transformer.build_model(config, 'decoder_only')
  tokens = jnp.zeros((5, 40), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))
  _, cache = jax.eval_shape(lambda p: model.apply(p, tokens, use_cache=True, mutable=['cache']), params)
  leaves = jax.tree_util.tree_leaves_with_path(cache['cache'])
  kv = sum(leaf.size * leaf.dtype.itemsize for path, leaf in leaves
           if jax.tree_util.keystr(path).endswith(("'cached_key']", "'cached_value']")))
  assert kv == probes.decoding_bytes_at_least(config, 5, 40)
  assert kv == 3 * 2 * 5 * 40 * 24 * (4 if compute_dtype == 'float32' else 2) // (3 if kv_heads == 1 else 1)


@pytest.mark.slow
def test_the_passkey_command_writes_its_grid_once_and_refuses_another_in_its_place(tmp_path):
  from experiments.runs import trainer  # pylint: disable=g-import-not-at-top
  from tests.helpers import smoke_experiment, subprocess_environment  # pylint: disable=g-import-not-at-top
  from tests.test_long_context import TINY_SHAKESPEARE  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'rope'
  trainer.run(smoke_experiment(**TINY_SHAKESPEARE), str(workdir))

  def evaluate(*extra):
    return command_server.run([sys.executable, '-m', 'experiments.evaluate', f'--workdir={workdir}', '--probe=passkey',
                               '--lengths=100,128', '--depths=0,1', *extra], env=subprocess_environment(1),
                              capture_output=True, text=True, timeout=600)

  # Every refusal comes before the evaluation's directory exists: lengths beyond the held-out stream, a cache
  # beyond any machine's memory, repeated lengths or depths. The huge passkey and needle probes take the names the
  # valid ones below then write under.
  for extra, expected in (
      (['--trials=3', '--lengths=100000000', '--name=passkey-none-heldout-3'], 'error: --lengths: 100000000 needs'),
      (['--probe=needle', '--needles=1', '--lengths=1000000', '--trials=2'], 'error: --lengths: 1000000 needs'),
      (['--trials=3', '--probe_filler=classic', '--lengths=10000000000'],
       'error: --lengths: 10000000000 would cache at least'),
      (['--trials=3', '--lengths=100,128,100'], "error: --lengths: got '100,128,100', which repeats 100; valid: each "
                                                'value once'),
      (['--trials=3', '--depths=0,0.5,0.50'], "error: --depths: got '0,0.5,0.50', which repeats 0.5; valid: each value "
                                              'once')):
    refused = evaluate(*extra)
    assert refused.returncode == 2 and refused.stderr.startswith(expected), refused.stderr[-2000:]
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not (workdir / 'evaluations').exists()

  first = evaluate('--trials=3')
  assert first.returncode == 0, first.stderr[-2000:]
  directory = workdir / 'evaluations' / 'passkey-none-heldout-3'
  cells = json.loads((directory / 'results.json').read_text())['cells']
  assert [(cell['length'], cell['depth']) for cell in cells] == [(100, 0.0), (100, 1.0), (128, 0.0), (128, 1.0)]
  for cell in cells:
    assert cell['trials'] == 3 and len(cell['answers']) == 3 and cell['correct'] == round(3 * cell['rate'])
    assert 0.0 <= cell['low'] <= cell['rate'] <= cell['high'] <= 1.0
  assert (directory / 'heatmap.png').stat().st_size > 1000
  assert '| depth | 100 | 128 |' in first.stdout
  description = json.loads((directory / 'evaluation.json').read_text())
  assert description['probe'] == 'passkey' and description['trials'] == 3 and description['lengths'] == [100, 128]
  written = (directory / 'results.json').stat().st_mtime_ns

  again = evaluate('--trials=3', f'--output={tmp_path / "grid"}')  # read back, and the grid over its runs
  assert again.returncode == 0 and (directory / 'results.json').stat().st_mtime_ns == written
  table = (tmp_path / 'grid' / 'results.md').read_text()
  assert table.startswith('| row | seeds | 100 | 128 |\n') and f'\n| {description["variant"]} | 1 | ' in table
  collected = evaluate(f'--collect={directory}', f'--output={tmp_path / "collected"}')
  assert collected.returncode == 0 and (tmp_path / 'collected' / 'results.md').read_text() == table
  other = evaluate('--trials=4', '--name=passkey-none-heldout-3')
  assert other.returncode == 2 and other.stderr.startswith(f'error: {directory}: records another evaluation (trials: 3 '
                                                           'there, 4 now)')
  for extra, expected in ((['--depths=0,2'], "error: --depths: got '0,2'; valid: comma-separated numbers in [0, 1]"),
                          (['--lengths=64'], 'error: --lengths: got 64; valid: at least 97 tokens')):
    refused = evaluate('--trials=3', *extra)
    assert refused.returncode == 2 and refused.stderr.startswith(expected), refused.stderr
  assert sorted(path.name for path in (workdir / 'evaluations').iterdir()) == ['passkey-none-heldout-3']
  needle = evaluate('--probe=needle', '--needles=1', '--lengths=128', '--trials=2')
  assert needle.returncode == 0, needle.stderr[-2000:]
  cells = json.loads((workdir / 'evaluations' / 'needle-none-heldout-2-1needles' / 'results.json').read_text())['cells']
  assert [(cell['length'], cell['depth'], cell['trials']) for cell in cells] == [(128, 0.0, 2), (128, 1.0, 2)]
  refused = evaluate('--probe=needle', '--needles=2', '--lengths=128', '--trials=2')
  assert refused.returncode == 2 and refused.stderr.startswith('error: --lengths: got 128; valid: at least'), (
      refused.stderr)

  # A second writer of one evaluation directory is refused while the first holds it.
  from experiments.shared.files import exclusive_lock  # pylint: disable=g-import-not-at-top
  busy = workdir / 'evaluations' / 'busy'
  busy.mkdir()
  with exclusive_lock(str(busy / '.lock'), 'the test'):
    refused = evaluate('--trials=1', '--lengths=100', '--name=busy')
  assert refused.returncode == 2 and 'is in use by a running job (pid ' in refused.stderr, refused.stderr[-2000:]
  assert sorted(path.name for path in busy.iterdir()) == ['.lock']


def _lm_task(name: str, **changes):
  fields = dict(name=name, model_kind='decoder_only', vocab_size=0, min_length=1, max_length=160,
                eval_lengths=(160,), eval_batches=1, path=corpus_config.SHIPPED if name == 'corpus' else '')
  return TASKS[name](TaskSettings(**dict(fields, **changes)))


@pytest.mark.parametrize('name', ['shakespeare', 'corpus'])
def test_passkey_rows_replace_a_fraction_of_training_rows_and_end_with_their_answer(name):
  plain, mixed = _lm_task(name), _lm_task(name, passkey_fraction=0.5)
  assert mixed.validate() is None
  codec = passkey.codec_for(mixed)
  before, after = plain.batch(0, 3, 'train', 64), mixed.batch(0, 3, 'train', 64)
  np.testing.assert_array_equal(mixed.batch(0, 3, 'train', 64)['targets'], after['targets'])  # a function of the step
  changed = [row for row in range(64) if not np.array_equal(before['targets'][row], after['targets'][row])]
  assert 16 <= len(changed) <= 48
  for row in changed:
    inputs, targets = after['inputs'][row], after['targets'][row]
    assert inputs[0] == codec.bos and np.array_equal(inputs[1:], targets[:-1]) and len(targets) == 160
    text = codec.decode(targets.tolist())
    key = text.split('The pass key is ')[1][:passkey.KEY_DIGITS]
    assert key.isdigit() and text.endswith(passkey.QUESTION + passkey.answer_text(key)), text[-80:]
  for row in set(range(64)) - set(changed):
    np.testing.assert_array_equal(after['inputs'][row], before['inputs'][row])
  for key in ('weights', 'valid'):
    np.testing.assert_array_equal(after[key], before[key])
  np.testing.assert_array_equal(mixed.batch(0, 3, 'eval', 8)['targets'], plain.batch(0, 3, 'eval', 8)['targets'])


def test_a_passkey_fraction_the_task_cannot_take_is_refused_in_one_line():
  from experiments.runs import settings  # pylint: disable=g-import-not-at-top
  from tests.helpers import smoke_experiment  # pylint: disable=g-import-not-at-top
  assert _lm_task('shakespeare', passkey_fraction=0.5, max_length=102).validate() == (
      'task.max_length: got 102 with task.passkey_fraction=0.5; valid: at least 103, a passkey row\'s needle, '
      'question and answer')
  shortest = _lm_task('shakespeare', passkey_fraction=0.5, max_length=103)
  assert shortest.validate() is None and shortest.batch(0, 0, 'train', 8)['targets'].shape == (8, 103)
  assert _lm_task('corpus', passkey_fraction=0.5, packing='documents').validate().startswith(
      "task.passkey_fraction: got 0.5 with task.packing='documents'; valid: 0, or packing 'stream'")
  with pytest.raises(settings.ConfigError, match=r"^task.passkey_fraction: got 1.0; valid: a number in \[0, 1\)$"):
    smoke_experiment(**{'task.passkey_fraction': 1.0})
  with pytest.raises(settings.ConfigError, match=r"^task.passkey_fraction: got 0.25 with task.name='copy'; valid: 0"):
    smoke_experiment(**{'task.passkey_fraction': 0.25})


@pytest.mark.parametrize('name', ['shakespeare', 'corpus'])
def test_needle_rows_ask_for_one_of_their_needles_and_end_with_its_number(name):
  plain = _lm_task(name, max_length=320)
  mixed = _lm_task(name, max_length=320, passkey_fraction=0.25, needle_fraction=0.5, needles=3)
  assert mixed.validate() is None
  codec = passkey.codec_for(mixed)
  before, after = plain.batch(0, 5, 'train', 64), mixed.batch(0, 5, 'train', 64)
  kinds = {'passkey': 0, 'needle': 0}
  for row in range(64):
    inputs, targets = after['inputs'][row], after['targets'][row]
    text = codec.decode(targets.tolist())
    if np.array_equal(targets, before['targets'][row]):
      continue
    assert inputs[0] == codec.bos and np.array_equal(inputs[1:], targets[:-1]) and len(targets) == 320
    if 'The pass key is ' in text:
      kinds['passkey'] += 1
      continue
    kinds['needle'] += 1
    given = dict(re.findall(r'The special number for (\w+) is (\d+)\.', text[:text.rindex('What is the special')]))
    asked = re.search(r'What is the special number for (\w+)\? The special number for \1 is (\d+)\.$', text)
    assert len(given) == 3 and asked and given[asked.group(1)] == asked.group(2), text[-120:]
  assert 4 <= kinds['passkey'] <= 28 and 20 <= kinds['needle'] <= 44, kinds
  passkey_only = _lm_task(name, max_length=320, passkey_fraction=0.25).batch(0, 5, 'train', 64)
  for row in range(64):  # the passkey rows are the ones a passkey-only run has: one draw decides
    if 'The pass key is ' in codec.decode(after['targets'][row].tolist()):
      np.testing.assert_array_equal(after['targets'][row], passkey_only['targets'][row])


def test_needle_rows_the_task_cannot_take_are_refused_in_one_line():
  from experiments.runs import settings  # pylint: disable=g-import-not-at-top
  from tests.helpers import smoke_experiment  # pylint: disable=g-import-not-at-top
  shortest = needles.shortest_row(passkey.codec_for(_lm_task('shakespeare')), 2)
  assert _lm_task('shakespeare', needle_fraction=0.5, needles=2, max_length=shortest - 1).validate() == (
      f'task.max_length: got {shortest - 1} with task.needle_fraction=0.5; valid: at least {shortest}, a row\'s 2 '
      'needles, question and answer')
  fits = _lm_task('shakespeare', needle_fraction=0.5, needles=2, max_length=shortest)
  assert fits.validate() is None and fits.batch(0, 0, 'train', 8)['targets'].shape == (8, shortest)
  for changes, expected in (
      ({'task.needle_fraction': 0.6, 'task.passkey_fraction': 0.4},
       r'^task.needle_fraction: got 0.6 with task.passkey_fraction=0.4; valid: the two together below 1'),
      ({'task.needle_fraction': float('nan')}, r'^task.needle_fraction: got nan; valid: a finite number'),
      ({'task.needles': 0}, rf'^task.needles: got 0; valid: an integer from 1 to {len(needles.WORDS)}$'),
      ({'task.needle_fraction': 0.25}, r"^task.needle_fraction: got 0.25 with task.name='copy'; valid: 0")):
    with pytest.raises(settings.ConfigError, match=expected):
      smoke_experiment(**changes)
