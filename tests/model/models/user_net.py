"""A model as users write one: their own nn.Module classes, a forward(self, input) argument
(named as torch's own modules name it), batch norm, and PyTorch's TransformerEncoderLayer, whose
attention relax imports with a `take`."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return torch.relu(input + self.bn(self.conv(input)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block = Block(16)
        self.encoder = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                                  batch_first=True)
        self.head = nn.Linear(16, 10)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = self.block(torch.relu(self.stem(input)))  # [1, 16, 8, 8]
        tokens = self.encoder(x.flatten(2).transpose(1, 2))  # [1, 64, 16]
        return self.head(tokens.mean(1))


def model() -> nn.Module:
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():  # batch norm statistics that are not the identity
        net.block.bn.running_mean.uniform_(-0.5, 0.5)
        net.block.bn.running_var.uniform_(0.5, 1.5)
    return net


def example_inputs() -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)
