"""A tiny task built in the tests (independent of the task registry)."""

from __future__ import annotations

import torch
from torch import nn

from gradspec.tasks._base import Task, TensorData


class Tiny(nn.Module):
    def __init__(self, d: int = 6, h: int = 8, c: int = 3) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, d)
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, c)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.emb(tokens).mean(1))
        return self.fc2(torch.tanh(self.fc1(x)))


def tiny_task(n: int = 64, seed: int = 0, params: tuple[str, ...] = ("*",)) -> Task:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    tokens = torch.randint(0, 20, (n + 32, 5), generator=g)
    labels = (tokens.sum(1) % 3).long()
    return Task(
        name="tiny",
        model=Tiny(),
        train=TensorData({"tokens": tokens[:n], "labels": labels[:n]}),
        eval=TensorData({"tokens": tokens[n:], "labels": labels[n:]}),
        forward=lambda call, batch: call(batch["tokens"]),
        params=params,
        config={"n": n, "seed": seed},
    )
