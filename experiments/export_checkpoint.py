"""A run as a Hugging Face model folder that transformers loads (AutoModelForCausalLM.from_pretrained(DIR)).

  python -m experiments.export_checkpoint --workdir=runs/NAME --output=exports/NAME

Writes config.json, model.safetensors (float32) and, when the run has a tokenizer, tokenizer.json, for the runs
transformers has a class for (experiments/pretrained/hugging_face_export.py): the RoPE decoder in the Llama-style
block (pre-RMSNorm, SwiGLU, no biases; LlamaForCausalLM, or Qwen2ForCausalLM with query, key and value biases),
its extension as rope_scaling (pi -> linear, llama3, yarn ramped over pair indices); learned positions in GPT-2's
block (GPT2LMHeadModel); RoPE or p_rope's rescaled partial rotation in GPT-NeoX's (GPTNeoXForCausalLM). Any other
run is refused, naming the field and why. Everything is written to OUTPUT.partial/ and renamed at the end; an
output folder that is not empty is refused.
"""

import json
import os
import shutil

from absl import flags

from experiments.pretrained import hugging_face_export
from experiments.pretrained.tables import PretrainedError
from experiments.runs import checkpoints, run_record
from experiments.shared import cli
from experiments.shared.files import write_json_atomically, write_text_atomically

# What the summary's second line shows of config.json: the positions, whichever architecture holds them.
POSITION_FIELDS = ('rope_theta', 'rotary_emb_base', 'rotary_pct', 'rope_scaling', 'max_position_embeddings',
                   'n_positions')

_WORKDIR = flags.DEFINE_string('workdir', None, 'The run to export (trained here or imported).')
_OUTPUT = flags.DEFINE_string('output', None, 'The folder to write (new, or empty).')


def main(argv):
  if len(argv) > 1:
    raise cli.CommandError(f'unexpected arguments: {" ".join(argv[1:])}; valid: --workdir, --output')
  if not _WORKDIR.value or not _OUTPUT.value:
    raise cli.CommandError(f'--{"workdir" if not _WORKDIR.value else "output"}: missing; valid: --workdir=RUN '
                           '--output=FOLDER')
  output = os.path.abspath(_OUTPUT.value)
  cli.check_output_path('--output', output, directory=True)
  if os.path.isdir(output) and os.listdir(output):
    raise cli.CommandError(f'--output: got {_OUTPUT.value!r}, a folder that is not empty; valid: a new or empty folder')
  resolved = run_record.stored_config(_WORKDIR.value)
  if resolved is None:
    raise cli.CommandError(f'--workdir: {_WORKDIR.value} has no {run_record.CONFIG_FILE}; valid: a run directory')
  if resolved['task']['model_kind'] != 'decoder_only':
    raise cli.CommandError(f'task.model_kind: got {resolved["task"]["model_kind"]!r}; valid for a Hugging Face '
                           'export: decoder_only')
  try:
    model, variables, tokenizer = checkpoints.load_model(_WORKDIR.value)
    context = int(resolved.get('source', {}).get('context_length') or resolved['task']['max_length'])
    config_json = hugging_face_export.hf_config(model.config, context)
    tensors = hugging_face_export.hf_tensors(variables, model.config)
  except (PretrainedError, ValueError, FileNotFoundError) as error:
    raise cli.CommandError(str(error)) from None
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  partial = output + '.partial'
  if os.path.exists(partial):
    shutil.rmtree(partial)
  os.makedirs(partial)
  try:
    save_file(tensors, os.path.join(partial, 'model.safetensors'), metadata={'format': 'pt'})
    write_json_atomically(os.path.join(partial, 'config.json'), config_json)
    if tokenizer is not None:
      write_text_atomically(os.path.join(partial, 'tokenizer.json'), tokenizer.to_str())
    if os.path.isdir(output):
      os.rmdir(output)
    os.rename(partial, output)
  finally:
    if os.path.exists(partial):
      shutil.rmtree(partial, ignore_errors=True)
  print(f'{output}: {config_json["architectures"][0]} ({len(tensors)} tensors, '
        f'{sum(t.size for t in tensors.values()):,} parameters){", tokenizer.json" if tokenizer else ""}')
  print(json.dumps({key: config_json[key] for key in POSITION_FIELDS if key in config_json}, sort_keys=True))


if __name__ == '__main__':
  cli.run(main)
