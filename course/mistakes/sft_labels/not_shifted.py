"""labels not shifted: position t asked to predict its own input.

The model at position t predicts the token at t + 1: labels[t] = ids[t + 1] (where that token is
trained), and the last position has no target.
"""

from __future__ import annotations

import numpy as np
import torch

from utils.labels import IGNORE_INDEX


def shifted_labels(ids: np.ndarray, loss_mask: np.ndarray) -> torch.Tensor:
    labels = np.where(loss_mask == 1, ids.astype(np.int64), IGNORE_INDEX)
    return torch.from_numpy(labels)
