"""The length-generalisation protocol of Kazemnejad et al. 2023, "The Impact of Positional Encoding on
Length Generalization in Transformers" (NeurIPS 2023), on the tasks of theirs this project has, at
their lengths: a decoder-only model trained on sizes 1 to L and scored by exact match (the whole
answer right) beyond L; variants ranked per task and by mean reciprocal rank over the tasks.

  copy, reverse            trained on sizes up to 20, evaluated to 40
  addition, sort, parity   trained on sizes up to 8, evaluated to 16

Command (a sweep per task, then the ranking):
  python -m experiments.compare --config=configs/length_generalization.py:copy --positions=all --seeds=3 \
      --workdir=runs/lg-copy            (likewise reverse, addition, sort, parity)
  python -m experiments.rank --sweeps=runs/lg-copy,runs/lg-reverse,runs/lg-addition,runs/lg-sort,runs/lg-parity
Their five variants are --positions=none,t5,alibi,rope,sinusoidal (their APE is the sinusoidal one);
docs/results.md ranks those and the learned table.

The score is sequence_accuracy: every answer token right under teacher forcing, which is greedy
decoding's exact match (a greedy decoder that has been right so far sees exactly the teacher-forced
prefix). The models are this project's small ones (configs/algorithmic.py), not the paper's ~100M
decoder; the training steps too: what is compared is the ranking, not the accuracies.
CPU time: per run, about that of configs/algorithmic.py's task (4 minutes for copy; addition 14).
"""

from configs import algorithmic

PROTOCOL = {
    'copy': dict(max_length=20, eval_lengths=(10, 20, 25, 30, 35, 40)),
    'reverse': dict(max_length=20, eval_lengths=(10, 20, 25, 30, 35, 40)),
    'addition': dict(max_length=8, eval_lengths=(4, 8, 10, 12, 14, 16)),
    'sort': dict(max_length=8, eval_lengths=(4, 8, 10, 12, 14, 16)),
    'parity': dict(max_length=8, eval_lengths=(4, 8, 10, 12, 14, 16)),
}


def get_config(task: str = 'copy'):
  if task not in PROTOCOL:
    raise ValueError(f'configs/length_generalization.py:{task}: not a task of the protocol; valid: '
                     f'{", ".join(PROTOCOL)}')
  config = algorithmic.get_config(task)
  config.task.model_kind = 'decoder_only'
  config.task.min_length = 1
  for field, value in PROTOCOL[task].items():
    config.task[field] = value
  return config
