"""FedUR with a trainable piece of its own: a residual linear adapter on each client's image features,
f' = normalize(f + f A), A (D, D) starting at zero (so round 1 starts from FedUR's model), personal unless
`share_adapter`. A method of a user's own, outside fedur, in one file:

    PYTHONPATH=. python fedur/main.py --config configs/smoke.yaml --method examples.feature_adapter.FeatureAdapter
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedur.federated.client import ClientState
from fedur.methods import FedUR, Piece
from fedur.model.classifier import PromptedCLIP


class FeatureAdapter(FedUR):
    """FedUR plus a residual linear adapter on the image features, trained with the prompts."""

    def __init__(self, share_adapter: bool = False, **kwargs) -> None:
        """
        Args:
            share_adapter: Whether the server averages the adapter (else each client keeps its own).
        """
        super().__init__(**kwargs)
        self.share_adapter = share_adapter

    def pieces(self) -> dict[str, Piece]:
        adapter = Piece(lambda model, seed: torch.zeros(model.feature_dim, model.feature_dim), shared=self.share_adapter)
        return {**super().pieces(), "adapter": adapter}

    def logits(self, model: PromptedCLIP, images: Tensor, pieces: dict[str, Tensor], text: Any,
               client: ClientState, rows: Tensor | None = None) -> Tensor:
        features = model.image_features(images, visual=pieces.get("visual"))  # (B, D)
        adapted = F.normalize(features + features @ pieces["adapter"].to(features.dtype), dim=-1)
        return model.logits(adapted, text)
