"""A transformer's feed-forward block and an attention score, for `--dtype bfloat16`: two
linear layers (their weights become bf16), a GELU, a layer norm, and `x @ x.T` (two
activations: it stays float32)."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x + self.down(nn.functional.gelu(self.up(x))))
        return torch.softmax(h @ h.T / 8.0, dim=-1) @ h


def model() -> nn.Module:
    torch.manual_seed(0)
    return Block().eval()


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(32, 64, generator=torch.Generator().manual_seed(1)),)
