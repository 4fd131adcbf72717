"""Every shape-suffixed name in the library and the experiments uses the letters of one legend, the one
in transformer/__init__.py's docstring, and the docs carry the same legend."""

import pathlib
import re

import transformer

ROOT = pathlib.Path(__file__).resolve().parents[1]
AXIS = r'(?:\d*[A-Z][a-z]?|bq|bk|\d+)'
SHAPED_NAME = re.compile(r'\b[a-z][a-z0-9_]*?_(' + AXIS + r'(?:x' + AXIS + r')*)\b')


def legend_rows():
  """(letter, meaning) for each row of the docstring's legend block, in order."""
  return re.findall(r'^  (\S+) +(\S.*)$', transformer.__doc__, flags=re.MULTILINE)


def legend():
  return dict(legend_rows())


def shaped_names(text):
  """(name, axes) for names whose suffix after the last underscore is axes joined by x, with a capital."""
  for match in SHAPED_NAME.finditer(text):
    axes = match.group(1).split('x')
    if any(re.search(r'[A-Z]|^b[qk]$', axis) for axis in axes):
      yield match.group(0), axes


def test_the_legend_gives_each_letter_one_meaning():
  letters = [letter for letter, _ in legend_rows()]
  assert len(letters) == len(set(letters)) >= 20, letters
  assert {'B', 'H', 'Lq', 'Lk', 'K', 'V', 'C', 'M', 'P', 'R'} <= set(letters)


def test_every_shaped_name_uses_the_legend():
  known = set(legend())
  unknown = {}
  for path in sorted([*ROOT.glob('transformer/**/*.py'), *ROOT.glob('experiments/**/*.py')]):
    for name, axes in shaped_names(path.read_text()):
      for axis in axes:
        letter = re.sub(r'^\d+(?=[A-Z])', '', axis)  # 3D: three times D
        if not letter.isdigit() and letter not in known:
          unknown.setdefault(f'{path.relative_to(ROOT)}: {name}', axis)
  assert not unknown, f'shape letters not in the legend of transformer/__init__.py: {unknown}'


def test_the_check_finds_a_letter_outside_the_legend():
  names = dict(shaped_names('logits_BxTxV = f(query_BxLqxHxK); max_length = 3; k_index_1xbk = 0'))
  assert names == {'logits_BxTxV': ['B', 'T', 'V'], 'query_BxLqxHxK': ['B', 'Lq', 'H', 'K'],
                   'k_index_1xbk': ['1', 'bk']}
  assert 'T' not in legend()


def test_the_architecture_tour_lists_the_same_letters():
  tour = (ROOT / 'docs' / 'architecture.md').read_text()
  section = tour.split('### Shape letters', 1)[1].split('\n## ', 1)[0]
  cells = re.findall(r'\| ([^|]+?) \|', section)
  listed = set()
  for cell in cells:
    listed.update(part.strip() for part in cell.split(','))
  assert set(legend()) <= listed, set(legend()) - listed
