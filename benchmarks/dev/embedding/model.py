"""A sentence encoder: hashed word pieces, a 2-layer transformer of width 256, a unit vector out.

One class only: TorchServe's ``BaseHandler`` loads model.py by taking the single class it
defines and calling it without arguments.
"""

import torch
from torch import nn

VOCAB = 32768  # hashed word pieces; id 0 is padding
MAX_TOKENS = 512
WIDTH = 256


class SentenceEncoder(nn.Module):
    """Token and position embeddings, 2 post-norm encoder layers, masked mean pooling, L2 norm."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.positions = nn.Embedding(MAX_TOKENS, WIDTH)
        layer = nn.TransformerEncoderLayer(
            d_model=WIDTH, nhead=4, dim_feedforward=1024, dropout=0.0, batch_first=True
        )
        # Without nested tensors: they warn as a prototype, and they would compute a padded
        # batch another way than a row alone.
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``ids`` [n, L] token ids, ``mask`` [n, L] true on real tokens; [n, 256] out."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.tokens(ids) + self.positions(positions).unsqueeze(0)
        hidden = self.encoder(hidden, src_key_padding_mask=~mask)
        # masked_fill, not a product: a pad position's output is not guaranteed finite.
        hidden = hidden.masked_fill(~mask.unsqueeze(-1), 0.0)
        counts = mask.sum(dim=1, keepdim=True).clamp(min=1).to(hidden.dtype)
        pooled = hidden.sum(dim=1) / counts
        return nn.functional.normalize(pooled, dim=-1)
