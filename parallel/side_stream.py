"""A CUDA side stream, made on first use: where work that should overlap the compute stream is
queued (PowerSGD's compression math, OverlappedAdamW's bucket steps). On a CPU there is none
and the work runs inline, so the same code runs, and is tested, everywhere.
"""

from __future__ import annotations

import torch


class SideStream:
    def __init__(self) -> None:
        self.stream: torch.cuda.Stream | None = None
        """None until the first CUDA tensor asks for it."""

    def on(self, device: torch.device) -> torch.cuda.Stream | None:
        """The stream for work on `device`, or None on a CPU (run inline)."""
        if device.type != "cuda":
            return None
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=device)
        return self.stream
