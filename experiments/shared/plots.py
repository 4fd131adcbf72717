"""What every plot of a sweep or an evaluation draws alike."""


def line_style(index: int) -> dict:
  """Matplotlib's ten colours, then the same colours dashed with square markers, so that a plot of more
  than ten rows never draws two alike."""
  return dict(color=f'C{index % 10}', linestyle='-' if index // 10 % 2 == 0 else '--',
              marker='o' if index // 10 % 2 == 0 else 's')
