"""averaging per micro-batch instead of over the global batch's tokens.

Each micro-batch divided by its own count weighs a token by 1 / (tokens of its micro-batch): the
objective then depends on how the global batch is split. Divide every micro-batch by the global
count (per replica).
"""

from __future__ import annotations

import torch

from trainer.global_batch import Batch, _device_of, term_counts


def attach_per_replica(micro_batches: list[Batch], totals: dict[str, float], replicas: int
                       ) -> None:
    for key in totals:
        for batch in micro_batches:
            own = term_counts(batch)[key] * len(micro_batches)
            batch[key] = torch.tensor(max(own, 1.0), dtype=torch.float32,
                                      device=_device_of(batch))
