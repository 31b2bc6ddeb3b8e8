"""A token model small enough for inductor to compile each (rows, length) shape in a second
or two on a CPU: embeddings, one attention block that masks the padding out of its keys, a
mean over the real tokens, three logits. Its answer for a row does not depend on how far
the row is padded, so any micro-batch answers a text as it is answered alone."""

import torch
import torch.nn.functional as F

VOCAB = 1000
WIDTH = 32
HEADS = 4
MAX_POSITIONS = 512


class TinySeqNet(torch.nn.Module):
    # One class in the module: TorchServe's loader refuses a model file with more.
    def __init__(self) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, WIDTH)
        self.positions = torch.nn.Embedding(MAX_POSITIONS, WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.out = torch.nn.Linear(WIDTH, WIDTH)
        self.norm1 = torch.nn.LayerNorm(WIDTH)
        self.ff = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(), torch.nn.Linear(2 * WIDTH, WIDTH)
        )
        self.norm2 = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids: (rows, length) token ids; mask: (rows, length), True on real tokens."""
        rows, length = ids.shape
        x = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        q, k, v = self.qkv(x).view(rows, length, 3, HEADS, WIDTH // HEADS).unbind(2)
        # Padded keys are masked out; padded queries still see the real keys (no NaN), and
        # the pooling below ignores them.
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None, None]
        )
        x = self.norm1(x + self.out(attended.transpose(1, 2).reshape(rows, length, WIDTH)))
        x = self.norm2(x + self.ff(x))
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.head(pooled)
