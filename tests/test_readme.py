"""The README's Python examples run as written, and its test command is what CI runs."""

import contextlib
import io
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / 'README.md').read_text()
DOCS = [README] + [path.read_text() for path in sorted((ROOT / 'docs').glob('*.md'))]


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


CHECK_COMMAND = '''
import sys
module, arguments = sys.argv[1], sys.argv[2:]
if module == 'experiments.benchmark' and arguments and not arguments[0].startswith('-'):
  module = 'experiments.benchmarks.' + arguments.pop(0)
import importlib
importlib.import_module(module)
from experiments.shared import cli
cli.parse_flags([module] + arguments)
from absl import flags
if 'config' in flags.FLAGS:
  import jax
  from experiments.runs import settings
  settings.from_config_dict(flags.FLAGS.config, jax.device_count())
'''


def documented_commands() -> list:
  """Every `python -m experiments.X ...` line of the bash blocks in README.md and docs/, its optional
  [parts] and comments left out."""
  found = []
  for text in DOCS:
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
      for line in block.replace('\\\n', ' ').splitlines():
        match = re.search(r'python -m (experiments\.\w+)(.*)', line.split('  #')[0])
        if match:
          found.append([match.group(1)] + shlex.split(re.sub(r'\[[^\]]*\]', '', match.group(2))))
  return found


@pytest.mark.slow
@pytest.mark.parametrize('command', documented_commands(), ids=' '.join)
def test_every_documented_command_parses_and_its_config_validates(command):
  """Each command's flags exist and parse, and a training command's config (with its overrides)
  validates, without running anything: the commands in the docs run as written."""
  result = subprocess.run([sys.executable, '-c', CHECK_COMMAND, *command], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu',
                                                XLA_FLAGS='--xla_force_host_platform_device_count=1'))
  assert result.returncode == 0, result.stderr[-1500:]


def test_every_source_file_is_in_git():
  """A file git ignores or was never told about is missing from every clean clone (CI's included)."""
  listed = subprocess.run(['git', 'ls-files', '--others', '--', 'transformer', 'experiments', 'configs', 'tests',
                           'pyproject.toml', 'README.md', 'docs'], cwd=ROOT, capture_output=True, text=True)
  if listed.returncode != 0:
    pytest.skip('not a git checkout: nothing to compare with')
  missing = [p for p in listed.stdout.split() if p.endswith(('.py', '.md', '.toml', '.png')) and '__pycache__' not in p]
  assert not missing, f'not in git (git add them, or fix .gitignore): {missing}'
