"""The README's Python examples run as written, and its test command is what CI runs."""

import contextlib
import io
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / 'README.md').read_text()


def test_python_examples_run_and_print_what_they_claim():
  blocks = re.findall(r'```python\n(.*?)```', README, re.S)
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
