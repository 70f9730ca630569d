"""The pipeline schedules' orders (parallel/pipeline_parallel/schedules.py), without processes:
each stage's order is the one drawn in the module docstring, forwards every micro-batch once
and then its backward, runs the backwards in micro-batch order, and holds at most
`micro_batches_in_flight` micro-batches' activations. (The gradients do not show a wrong order:
test_pipeline_parallel.py's comparison with torch's Schedule1F1B passes any complete order;
only the memory, or a deadlock, differs.)"""

from __future__ import annotations

import re

import pytest

from parallel.pipeline_parallel import schedules
from parallel.pipeline_parallel.schedules import (
    all_forward_all_backward_order,
    micro_batches_in_flight,
    one_forward_one_backward_order,
)


def _drawn_orders(schedule: str) -> list[list[tuple[str, int]]]:
    """The stage rows drawn under `schedule` in the module docstring, idle slots dropped."""
    drawing = schedules.__doc__.split(f"    {schedule} (")[1].split("\n\n")[0]
    rows = re.findall(r"stage \d+ (.*)", drawing)
    return [[(slot[0], int(slot[1:])) for slot in row.split() if slot != "."] for row in rows]


def test_orders_are_the_docstring_drawings():
    drawn_1f1b, drawn_afab = _drawn_orders("1f1b"), _drawn_orders("afab")
    assert len(drawn_1f1b) == len(drawn_afab) == 3
    for stage in range(3):
        assert one_forward_one_backward_order(3, stage, 4) == drawn_1f1b[stage], stage
        assert all_forward_all_backward_order(4) == drawn_afab[stage]


@pytest.mark.parametrize("stages, micro_batches", [(2, 1), (2, 4), (3, 2), (4, 4), (4, 9)])
def test_1f1b_is_complete_in_order_and_holds_at_most_p_minus_s(stages, micro_batches):
    for stage in range(stages):
        order = one_forward_one_backward_order(stages, stage, micro_batches)
        forwards = [index for kind, index in order if kind == "F"]
        backwards = [index for kind, index in order if kind == "B"]
        assert forwards == backwards == list(range(micro_batches)), (stage, order)
        held, peak = 0, 0
        for kind, _ in order:
            held += 1 if kind == "F" else -1
            assert held >= 0, f"stage {stage}: a backward before its forward in {order}"
            peak = max(peak, held)
        assert peak == micro_batches_in_flight("1f1b", stages, stage, micro_batches), (stage, order)
