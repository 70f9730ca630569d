"""Tensor parallelism (Megatron-LM's column/row scheme) with sequence parallelism.

Read in this order: collectives.py (the four conjugate collectives and their backward),
sharding.py (which weight is split how), cross_entropy.py (the loss over a split vocabulary),
layers.py (the parallel modules), parallelize.py (a z2all model turned tensor-parallel).
"""
