"""Pretrained models from other tools' checkpoints: their configs mapped to transformer.ModelConfig and their
weights to this library's parameters (hugging_face.py: Hugging Face folders of safetensors)."""
