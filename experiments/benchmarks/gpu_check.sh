#!/usr/bin/env bash
# The accelerator check of the attention cores, about ten to fifteen minutes on one GPU, from the
# repository root after `pip install -e '.[test,peer]'` with the accelerator's jax (and PyTorch's
# CUDA build for the peers):
#
#   bash experiments/benchmarks/gpu_check.sh [OUTPUT_DIRECTORY] [PEAK_FLOPS]
#
# 1. the Pallas kernels compiled for this device against dense attention, forward and gradients;
# 2. one causal attention, forward and backward, at length 4096, batch 8, 16 heads of 64, bfloat16:
#    our cores, the Pallas kernel with no term, ALiBi's and T5's inside, and PyTorch's FlexAttention
#    with the same terms as score_mod;
# 3. the training step at d_model 1024, 16 heads, 12 layers, batch 8, bfloat16, lengths 1024 and 4096,
#    for none, RoPE, ALiBi, T5 and KERPLE, with the default core (auto: cuDNN where the variant adds no
#    term) beside x-transformers with and without its flash attention, then with the Pallas kernel;
#    MFU against PEAK_FLOPS (default 989e12, an H100/H200's bfloat16 dense peak);
# 4. the GPT-2 small preset's training step (configs/gpt2.py:small on the shipped corpus, whose 4,096 tokens
#    make it 88.2M parameters; batch 32 x 1024, bfloat16) as the trainer runs it, plain and with each
#    model.remat policy: tokens/s, MFU, device memory at its peak and what XLA's compiled step needs.
# Tables on the terminal and in OUTPUT_DIRECTORY (*.txt, and the step rows as *.json).
set -euo pipefail
OUTPUT=${1:-gpu-check}
PEAK=${2:-989e12}
mkdir -p "$OUTPUT"
python -c 'import jax; print(jax.devices())' | tee "$OUTPUT/devices.txt"
python -m pytest -p no:cacheprovider -q tests/test_flash_attention.py -k compiled 2>&1 | tee "$OUTPUT/kernels.txt"
python -m experiments.benchmark attention --length=4096 --batch_size=8 --num_heads=16 --head_dim=64 \
    --compute_dtype=bfloat16 --repeats=5 --pallas_rows --flex 2>&1 | tee "$OUTPUT/attention.txt"
GPU_SIZED="--positions=none,rope,alibi,t5,kerple_log --lengths=1024,4096 --batch_size=8 --model_dim=1024
  --num_heads=16 --num_layers=12 --feed_forward_dim=4096 --vocab_size=32768 --compute_dtype=bfloat16
  --steps=5 --warmup=2 --peak_flops=$PEAK"
# shellcheck disable=SC2086
python -m experiments.benchmark step $GPU_SIZED --attention_implementation=auto --peer \
    --json="$OUTPUT/step-auto.json" 2>&1 | tee "$OUTPUT/step-auto.txt"
# shellcheck disable=SC2086
python -m experiments.benchmark step $GPU_SIZED --attention_implementation=pallas \
    --json="$OUTPUT/step-pallas.json" 2>&1 | tee "$OUTPUT/step-pallas.txt"
python -m experiments.benchmark sharding --config=configs/gpt2.py:small --model= --steps=5 --warmup=2 \
    --rows='one device' --rows='one device, model.remat=block' --rows='one device, model.remat=matmuls' \
    --peak_flops="$PEAK" --sharding_json="$OUTPUT/gpt2-small.json" 2>&1 | tee "$OUTPUT/gpt2-small.txt"
