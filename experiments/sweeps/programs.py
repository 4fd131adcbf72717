"""Which runs of a sweep train together: a variant's unfinished seeds in one program
(experiments/runs/replicas.py) when they can resume together."""

import os

from experiments.sweeps import results


def resume_step(workdir: str) -> int:
  """The step a run would resume from: its newest checkpoint's (0 for none)."""
  directory = os.path.join(workdir, 'checkpoints')
  steps = [int(name) for name in os.listdir(directory) if name.isdigit()] if os.path.isdir(directory) else []
  return max(steps, default=0)


def programs(row: str, seeds: list[int], sweep: str, together: bool) -> list[list[int]]:
  """A row's unfinished seeds, grouped into the programs that train them: runs of consecutive seeds that
  resume from the same step (together), or one seed each."""
  groups = []
  for seed in seeds:
    step = resume_step(os.path.join(sweep, results.run_name(row, seed)))
    if together and groups and groups[-1][-1][0] == seed - 1 and groups[-1][-1][1] == step:
      groups[-1].append((seed, step))
    else:
      groups.append([(seed, step)])
  return [[seed for seed, _ in group] for group in groups]
