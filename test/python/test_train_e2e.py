"""End-to-end: the compiled training step on mapp-run's CPU backend against
PyTorch (Debian's torch 1.13, fp32) — same initial weights, same batches.

The exporter writes the reference GPT (and its LLaMA-style variant) and its
initial weights; mapp-opt differentiates it and adds AdamW; mapp-translate
writes the plan; mapp-run trains 50 steps and dumps the exact batches it
used. PyTorch trains mapp.reference.GPT on those batches with
torch.optim.AdamW. Every step's loss and every step-0 gradient must agree
within 1e-5 relative.
"""

import pytest
import torch

from mapp.reference import GPT
from train_harness import compile_and_train, train_torch_and_compare
from mapp import safetensors

STEPS = 50
TOLERANCE = 1e-5

CONFIGS = {
    "gpt-tied": {"variant": "gpt", "num_layers": 2, "hidden_size": 32,
                 "num_attention_heads": 4, "seq_length": 16, "vocab_size": 256,
                 "micro_batch_size": 2, "tie_embeddings": True},
    "llama": {"variant": "llama", "num_layers": 2, "hidden_size": 32,
              "num_attention_heads": 4, "ffn_hidden_size": 64, "seq_length": 16,
              "vocab_size": 256, "micro_batch_size": 2, "tie_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loss_curve_and_gradients_match_pytorch(tmp_path, name):
    cfg = CONFIGS[name]
    metrics, batches, mapp_grads = compile_and_train(tmp_path, cfg, STEPS)
    torch.manual_seed(0)
    model = GPT(cfg)
    weights = safetensors.load(tmp_path / "init.safetensors")[0]
    worst = train_torch_and_compare(model, weights, metrics, batches, mapp_grads, TOLERANCE)
    # The run must actually learn: the loss falls.
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    print(f"{name}: worst relative loss difference over {STEPS} steps {worst:.2e}")
