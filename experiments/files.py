"""Atomic file writes: a reader (or a restart after a kill) sees the old file or the new one, never
half of one. Written to PATH.tmp, then renamed over PATH."""

import json
import os


def write_text_atomically(path: str, text: str) -> None:
  temporary = path + '.tmp'
  with open(temporary, 'w', newline='') as file:
    file.write(text)
  os.replace(temporary, path)


def write_json_atomically(path: str, payload) -> None:
  write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=True))
