"""the loss mask read at t instead of t + 1 (off by one).

The mask marks the tokens to be predicted; the label at t is the token at t + 1, so it is kept
where loss_mask[t + 1] is 1. Reading loss_mask[t] trains the last prompt token's successor and
drops the answer's last token.
"""

from __future__ import annotations

import numpy as np
import torch

from utils.labels import IGNORE_INDEX


def shifted_labels(ids: np.ndarray, loss_mask: np.ndarray) -> torch.Tensor:
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = np.where(loss_mask[:-1] == 1, ids[1:].astype(np.int64), IGNORE_INDEX)
    return torch.from_numpy(labels)
