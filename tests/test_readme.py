"""The README's Python examples run as written, and its test command is what CI runs."""

import contextlib
import io
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests import command_server
from tests.xla_flags import xla_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / 'README.md').read_text()
DOCS = [README] + [path.read_text() for path in sorted((ROOT / 'docs').glob('*.md'))]


@pytest.mark.slow
def test_python_examples_run_and_print_what_they_claim():
  blocks = [block for text in DOCS for block in re.findall(r'```python\n(.*?)```', text, re.S)]
  assert blocks
  for block in blocks:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      exec(compile(block, 'README.md', 'exec'), {})  # pylint: disable=exec-used
    claimed = re.findall(r'print\(.*\)\s+# (.*)', block)
    assert printed.getvalue().split('\n')[:len(claimed)] == claimed


def test_ci_runs_the_readme_test_command():
  command = "pip install -e '.[test]' && python -m pytest -n auto"
  assert command in README
  assert command in (ROOT / '.ci' / 'run').read_text()


def heading_anchors(text: str) -> set:
  """The anchors GitHub gives a markdown file's headings: lower case, punctuation dropped, spaces as -."""
  return {re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
          for heading in re.findall(r'^#+ (.*)$', text, re.M)}


def test_links_between_the_docs_point_at_files_and_headings_that_exist():
  for path in [ROOT / 'README.md', ROOT / 'BENCHMARKS.md'] + sorted((ROOT / 'docs').glob('*.md')):
    for target, anchor in re.findall(r'\]\(([^)#\s]+)(?:#([^)]*))?\)', path.read_text()):
      if not target.startswith('http'):
        assert (path.parent / target).exists(), f'{path.name} links to {target}, which does not exist'
        if anchor and target.endswith('.md'):
          assert anchor in heading_anchors((path.parent / target).read_text()), \
              f'{path.name} links to {target}#{anchor}, a heading {target} does not have'


def _module(command: list) -> tuple:
  """The module a documented command runs, and its arguments (the benchmark's first argument names one)."""
  module, arguments = command[0], command[1:]
  if module == 'experiments.benchmark' and arguments and not arguments[0].startswith('-'):
    return 'experiments.benchmarks.' + arguments[0], arguments[1:]
  return module, arguments


USER_CORPUS = 'corpora/mine'  # the folder the docs' prepare_corpus command writes and their train command reads


def documented_commands() -> list:
  """Every `python -m experiments.X ...` line of the bash blocks in README.md and docs/, its optional
  [parts] and comments left out."""
  found = []
  for text in DOCS:
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
      for line in block.replace('\\\n', ' ').splitlines():
        match = re.search(r'python -m (experiments(?:\.\w+)+)(.*)', line.split('  #')[0])
        if match:
          found.append([match.group(1)] + shlex.split(re.sub(r'\[[^\]]*\]', '', match.group(2))))
  return found


def documented_commands_by_module() -> dict:
  by_module = {}
  for command in documented_commands():
    module, arguments = _module(command)
    by_module.setdefault(module, []).append(arguments)
  return by_module


@pytest.mark.slow
@pytest.mark.parametrize('module', sorted(documented_commands_by_module()))
def test_every_documented_command_parses_and_its_config_validates(module, tmp_path):
  """Each command's flags exist and parse, and a training command's config (with its overrides)
  validates, without running anything: the commands in the docs run as written. One process per module,
  its flags reset to their defaults between commands; the failures name their commands. The user's corpus
  the docs prepare (USER_CORPUS) is a small one prepared here, as the documented prepare command would."""
  commands = documented_commands_by_module()[module]
  if any(USER_CORPUS in argument for command in commands for argument in command):
    texts = tmp_path / 'texts'
    texts.mkdir()
    for index in range(40):
      (texts / f'{index}.txt').write_text(' '.join(f'word{(index * 7 + k) % 50}' for k in range(400 + index)))
    prepared = command_server.run([sys.executable, '-m', 'experiments.prepare_corpus', f'--input={texts}',
                                   f'--output={tmp_path / "corpus"}', '--tokenizer=bytes', '--heldout_fraction=0.2'],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    commands = [[argument.replace(USER_CORPUS, str(tmp_path / 'corpus')) for argument in command]
                for command in commands]
  result = command_server.run([sys.executable, '-m', 'tests.documented_commands', module, json.dumps(commands)],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(1)))
  assert result.returncode == 0, f'{len(commands)} commands of {module}:\n{result.stderr[-3000:]}'


def test_every_source_file_is_in_git():
  """A file git ignores or was never told about is missing from every clean clone (CI's included)."""
  listed = subprocess.run(['git', 'ls-files', '--others', '--', 'transformer', 'experiments', 'configs', 'tests',
                           'pyproject.toml', 'README.md', 'docs'], cwd=ROOT, capture_output=True, text=True)
  if listed.returncode != 0:
    pytest.skip('not a git checkout: nothing to compare with')
  missing = [p for p in listed.stdout.split() if p.endswith(('.py', '.md', '.toml', '.png')) and '__pycache__' not in p]
  assert not missing, f'not in git (git add them, or fix .gitignore): {missing}'
