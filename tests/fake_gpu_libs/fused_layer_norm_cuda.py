"""Fake `fused_layer_norm_cuda`: apex's compiled fused LayerNorm/RMSNorm kernels.

A source install of apex without `--cpp_ext --cuda_ext` lacks it; the fake norm imports it when
the real one does, so setting `sys.modules["fused_layer_norm_cuda"] = None` reproduces that."""
