"""The names and headers of the optimizer state files, below every optimizer that writes one
and the reader that translates one layout into another (distributed_optimizer/zero1_checkpoint.py).

    optim/optimizer.pt                  ZeRO-0 (optimizer.py): format "z2all-optimizer",
                                        version 2, the Adam state per tensor in the optimizer's
                                        param-group order
    optim/zero1_rank00000_of00002.pt    ZeRO-1/2/3 and a grid: format "z2all-zero1-shard",
                                        version 1, pieces by parameter name (zero1_checkpoint.py)
    optim/overlapped_adamw.pt           --comm_hook=overlap_optim (overlapped_adamw.py): format
                                        "z2all-overlapped-adamw", version 2, the parameter names
                                        of every bucket and each bucket's Adam state

Every state starts with (format, version, and for the first two a kind): a file of another
optimizer, or of an older format, is refused by name instead of being misread.
"""

from __future__ import annotations

from typing import Any

STATE_FORMAT = "z2all-optimizer"
STATE_VERSION = 1
REPLICATED_STATE_VERSION = 2  # 2: Adam state in the implementation-neutral form (adamw.py)
REPLICATED_CHECKPOINT_FILE = "optimizer.pt"
OVERLAPPED_FORMAT = "z2all-overlapped-adamw"
OVERLAPPED_VERSION = 2  # 2: each bucket's Adam state in the implementation-neutral form
OVERLAPPED_CHECKPOINT_FILE = "overlapped_adamw.pt"


def check_state_header(state: dict[str, Any], expected_format: str, expected_kind: str,
                       expected_version: int = STATE_VERSION) -> None:
    """Fail loudly when a state dict was written by another optimizer kind or format version."""
    found = (state.get("format"), state.get("version"), state.get("kind"))
    if found != (expected_format, expected_version, expected_kind):
        raise ValueError(f"optimizer state is {found}, expected "
                         f"{(expected_format, expected_version, expected_kind)}")
