"""Greedy decoding on copy reproduces its inputs exactly at the training lengths."""

import json
import sys

import jax
import pytest

from configs import algorithmic
from experiments.runs import settings, trainer
from experiments.evaluation import decoding
from tests import command_server


@pytest.mark.slow
def test_greedy_decoding_of_a_trained_copy_model_reproduces_its_inputs(tmp_path):
  config = algorithmic.get_config('copy')
  config.task.vocab_size = 5
  config.task.max_length = 4
  config.task.eval_lengths = (2, 4)
  config.model.position.kind = 'rope'
  config.train.steps = 200
  config.train.batch_size = 32
  config.train.eval_every = 200
  config.train.checkpoint_every = 200
  experiment = settings.from_config_dict(config, 1)
  trainer.run(experiment, str(tmp_path), devices=jax.devices()[:1])  # decoding is the point, not the devices

  # The command-line report, from the run directory alone: every answer, EOS included, the input copied.
  result = command_server.run([sys.executable, '-m', 'experiments.exact_match', f'--workdir={tmp_path}',
                               '--lengths=1-4',
                               '--examples=64'], capture_output=True, text=True, check=True)
  assert 'mean' in result.stdout
  report = json.loads((tmp_path / 'greedy_exact_match.json').read_text())
  assert report['exact_match'] == {'1': 1.0, '2': 1.0, '3': 1.0, '4': 1.0}


@pytest.mark.parametrize('text', ['0-3', '4-', 'a,b', '', '2,-1'])
def test_bad_lengths_name_the_flag(text):
  with pytest.raises(ValueError, match='--lengths: got'):
    decoding.parse_lengths(text)


def test_lengths_parse():
  assert decoding.parse_lengths('1-4') == [1, 2, 3, 4]
  assert decoding.parse_lengths('4,8,16') == [4, 8, 16]
