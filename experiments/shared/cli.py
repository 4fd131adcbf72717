"""What every command shares: a refusal is one line on stderr and exit code 2; flags and config
overrides are checked before anything else happens; SIGTERM and Ctrl-C end it cleanly.

  from experiments.shared import cli
  if __name__ == '__main__':
    cli.run(main)
"""

import difflib
import importlib.util
import os
import sys
import tempfile
from typing import NoReturn, Optional

from absl import app, flags, logging

from experiments.shared.signals import STOP, Interrupted

CONFIG_PREFIX = '--config.'


class CommandError(Exception):
  """A refusal: its message is the one line the command prints after 'error: '."""


def one_line(error) -> str:
  return ' '.join(str(error).split())


def fail(message: str) -> NoReturn:
  print(f'error: {one_line(message)}', file=sys.stderr)
  sys.exit(2)


def check_output_path(flag: str, path: str, directory: bool = False) -> None:
  """CommandError unless `path` can be written: a file whose directory exists and takes a new file (probed with
  a temporary file, removed at once: permissions alone do not say, for root or on /proc), or a directory that
  exists or can be made under a writable one. Leaves nothing behind."""
  absolute = os.path.abspath(path)
  if os.path.exists(absolute) and os.path.isdir(absolute) != directory:
    raise CommandError(f'{flag}: got {path!r}, which is a {"file" if directory else "directory"}; valid: a '
                       f'{"directory" if directory else "file"} path')
  parent = absolute if directory else os.path.dirname(absolute)
  if directory:
    while not os.path.exists(parent):
      parent = os.path.dirname(parent)
  elif not os.path.isdir(parent):
    raise CommandError(f'{flag}: got {path!r}; valid: a file in an existing directory ({parent} is not one)')
  try:
    with tempfile.TemporaryFile(dir=parent):
      pass
  except OSError as error:
    raise CommandError(f'{flag}: got {path!r}; valid: a path under a writable directory ({parent}: '
                       f'{error.strerror or error})') from None


def print_and_write(text: str, output: Optional[str]) -> None:
  """Prints a command's tables, and writes them to output (a file path, checked by check_output_path) when given."""
  print(text)
  if output:
    from experiments.shared.files import write_text_atomically  # pylint: disable=g-import-not-at-top
    write_text_atomically(output, text)
    print(f'wrote {output}', file=sys.stderr)


def load_config_file(argument: str):
  """The ConfigDict that `--config=PATH[:ARG]` names, loaded as ml_collections loads it, with every way
  the file can fail named: missing, failing to import, no get_config, get_config raising, or
  returning something other than a ConfigDict."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  path, _, config_argument = argument.partition(':')
  if not os.path.isfile(path):
    raise CommandError(f'--config: got {argument!r}; valid: a config file, e.g. configs/algorithmic.py:copy '
                       f'({path} does not exist)')
  try:
    spec = importlib.util.spec_from_file_location('_checked_config', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  except Exception as error:  # pylint: disable=broad-except
    raise CommandError(f'--config: cannot load {path}: {type(error).__name__}: {one_line(error)}') from None
  if not callable(getattr(module, 'get_config', None)):
    raise CommandError(f'--config: {path} defines no get_config(); valid: a file with get_config() returning '
                       f'an ml_collections.ConfigDict')
  try:
    config = module.get_config(config_argument) if config_argument else module.get_config()
  except Exception as error:  # pylint: disable=broad-except
    raise CommandError(f'--config: {argument}: get_config() raised {type(error).__name__}: '
                       f'{one_line(error)}') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise CommandError(f'--config: {argument}: get_config() returned a {type(config).__name__}; valid: an '
                       f'ml_collections.ConfigDict')
  return config


def define_config_flag(help_string: str):
  """--config=PATH[:ARG] with --config.FIELD=VALUE overrides. A variant's settings need not be in the
  config file (configs name none of them): an override may add a field under model.position, and
  check_override_fields has already refused any name that is no variant's setting."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  return config_flags.DEFINE_config_file('config', None, help_string, lock_config=False,
                                         accept_new_attributes=True)


def override_names(argv) -> list[str]:
  """The dotted fields of the --config.FIELD=VALUE (or --config.FIELD VALUE) arguments."""
  return [a[len(CONFIG_PREFIX):].split('=', 1)[0] for a in argv if a.startswith(CONFIG_PREFIX)]


def check_override_fields(config, names) -> None:
  """Every overridden field exists in the config, or is a positional variant's setting under
  model.position or model.local_position (a misspelling fails, with the nearest name)."""
  for name in names:
    section = config
    parts = name.split('.')
    for depth, part in enumerate(parts):
      keys = list(section.keys()) if hasattr(section, 'keys') else []
      if parts[:depth] in (['model', 'position'], ['model', 'local_position']) and depth == len(parts) - 1:
        import transformer  # pylint: disable=g-import-not-at-top
        keys = sorted(set(keys) | set(transformer.positions.setting_names()))
        if part in keys:
          break
      if part not in keys:
        where = '.'.join(parts[:depth]) or 'config'
        near = difflib.get_close_matches(part, keys, n=1)
        hint = f' (did you mean {".".join(parts[:depth] + near[:1])}?)' if near else ''
        raise CommandError(f'{CONFIG_PREFIX}{name}: unknown config field{hint}; valid fields of {where}: '
                           f'{", ".join(sorted(keys))}')
      section = section[part]


def config_argument(argv) -> Optional[str]:
  """The --config value; the last one given, as absl takes it."""
  found = None
  for index, argument in enumerate(argv):
    if argument.startswith('--config='):
      found = argument.split('=', 1)[1]
    elif argument == '--config' and index + 1 < len(argv):
      found = argv[index + 1]
  return found


def parse_flags(argv):
  """absl's parsing, but the config file and every override are checked first, and any bad flag gives
  one line and exit code 2 instead of a traceback or absl's usage text."""
  try:
    spec = config_argument(argv)
    if spec is not None:
      check_override_fields(load_config_file(spec), override_names(argv))
    return flags.FLAGS(argv)
  except CommandError as error:
    fail(str(error))
  except (flags.Error, KeyError, ValueError, AttributeError, TypeError) as error:
    cause = error.args[0] if isinstance(error, AttributeError) and error.args else error
    fail(one_line(cause))


def quiet_orbax(record) -> bool:
  """A logging filter: drops orbax's INFO chatter and JAX's note that no TPU is present."""
  return 'orbax' not in record.pathname and 'Unable to initialize backend' not in record.getMessage()


def run(main) -> None:
  """app.run(main) with one-line flag errors, orbax quietened, and SIGTERM/SIGINT handled from the
  first moment (experiments/shared/signals.py): a stop ends the command with exit code 0 and one line."""
  STOP.install()

  def guarded(argv):
    logging.get_absl_handler().addFilter(quiet_orbax)
    try:
      main(argv)
    except Interrupted as stop:
      logging.warning('%s received: stopped; nothing was left half-written', stop.signal_name)
      sys.exit(0)
    except CommandError as error:
      fail(str(error))

  app.run(guarded, flags_parser=parse_flags)
