"""A small bag-of-words sentiment model: hashed tokens, an EmbeddingBag and a linear layer."""

import torch
from torch import nn

VOCAB_BUCKETS = 2**16
EMBED_DIM = 64
NUM_CLASSES = 2


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(VOCAB_BUCKETS, EMBED_DIM, mode="mean")
        self.fc = nn.Linear(EMBED_DIM, NUM_CLASSES)

    def forward(self, token_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(token_ids, offsets))
