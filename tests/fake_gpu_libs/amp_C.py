"""Fake `amp_C`: apex's compiled multi-tensor kernels (FusedAdam's `multi_tensor_adam`).

A source install of apex without `--cpp_ext --cuda_ext` lacks it; the fake FusedAdam imports it
when the real one does, so setting `sys.modules["amp_C"] = None` reproduces that install."""
