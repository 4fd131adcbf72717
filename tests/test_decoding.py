"""Greedy decoding on copy reproduces its inputs exactly at the training lengths."""

import jax
import orbax.checkpoint as ocp

import transformer
from configs import algorithmic
from experiments import decoding, settings, trainer
from experiments.tasks import TASKS


def test_greedy_decoding_of_a_trained_copy_model_reproduces_its_inputs(tmp_path):
  config = algorithmic.get_config('copy')
  config.task.vocab_size = 5
  config.task.max_length = 4
  config.task.eval_lengths = (2, 4)
  config.model.position.kind = 'rope'
  config.train.steps = 400
  config.train.batch_size = 32
  config.train.eval_every = 400
  config.train.checkpoint_every = 400
  experiment = settings.from_config_dict(config, jax.device_count())
  trainer.run(experiment, str(tmp_path))

  task = TASKS['copy'](experiment.task)
  model = transformer.build_model(experiment.model, 'decoder_only')
  manager = ocp.CheckpointManager(str(tmp_path / 'checkpoints'))
  params = manager.restore(400, args=ocp.args.StandardRestore())['params']
  for length in range(1, 5):
    batch = task.batch(experiment.seed, 0, 'test', 64, length=length)
    answers = decoding.greedy_answers(task, model, params, batch, length)
    inputs = batch['inputs'][:, 1:length + 1]
    assert (answers[:, :length] == inputs).all(), f'length {length}: {answers[:3]} vs {inputs[:3]}'
    assert decoding.exact_match(task, model, params, batch, length) == 1.0
