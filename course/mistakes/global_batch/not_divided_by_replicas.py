"""the global count not divided by the number of replicas.

DDP averages the D replicas' gradients, which divides by D once more: each replica must divide
its sum by N / D, so that the average is (sum over all N tokens) / N.
"""

from __future__ import annotations

import torch

from trainer.global_batch import Batch, _device_of


def attach_per_replica(micro_batches: list[Batch], totals: dict[str, float], replicas: int
                       ) -> None:
    for key, total in totals.items():
        for batch in micro_batches:
            batch[key] = torch.tensor(max(total, 1.0), dtype=torch.float32,
                                      device=_device_of(batch))
