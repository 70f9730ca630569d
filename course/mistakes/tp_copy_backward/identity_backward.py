"""the input's gradient not summed over the tensor-parallel ranks.

Every rank used the same x for its own slice of the outputs, so dL/dx is the SUM of the ranks'
partial gradients: backward all-reduces (the conjugate of the row-parallel forward's all-
reduce).
"""

from __future__ import annotations


def backward(ctx, grad):
    return grad, None
