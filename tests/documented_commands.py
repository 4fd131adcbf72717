"""Parse documented command lines of one module, each in a fork: `python -m tests.documented_commands MODULE
COMMANDS_JSON`, COMMANDS_JSON a list of argument lists. Exits 0 when every one parses and its config (if it has
one) validates for this process's devices; otherwise names the ones that failed, each with its error.

Each command parses in a fork of its own, where its module defines its flags: ml_collections' config flags read
their overrides from sys.argv when they are defined, and absl's flags cannot be defined twice in one process.
tests/test_readme.py runs it in a fork of the tests' command server, which has imported the slow libraries.
"""

import importlib
import json
import os
import sys

import jax
from absl import flags

from experiments.runs import settings
from experiments.shared import cli


def check(module: str, arguments: list) -> None:
  sys.argv = [module] + arguments
  importlib.import_module(module)
  cli.parse_flags([module] + arguments)
  if 'config' in flags.FLAGS:
    settings.from_config_dict(flags.FLAGS.config, jax.device_count())


def main() -> None:
  module, commands = sys.argv[1], json.loads(sys.argv[2])
  failed = []
  for arguments in commands:
    child = os.fork()
    if child == 0:
      try:
        check(module, arguments)
      except BaseException as error:  # cli.parse_flags exits with its one line on stderr
        print(f'{type(error).__name__}: {error}', file=sys.stderr)
        os._exit(1)
      os._exit(0)
    _, status = os.waitpid(child, 0)
    if status != 0:
      failed.append(' '.join(arguments))
  if failed:
    sys.exit('failed: ' + '\n'.join(failed))


if __name__ == '__main__':
  main()
