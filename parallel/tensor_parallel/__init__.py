"""Tensor parallelism (Megatron-LM's column/row scheme) with sequence parallelism.

Read in this order: collectives.py (the four conjugate collectives and their backward),
sharding.py (how a split weight is sliced), cross_entropy.py (the loss over a split vocabulary),
layers.py (the parallel modules). Which weight of our llama is split how, and the model turned
tensor-parallel, are the plan's: parallel_plan/llama_tensor_parallel.py.
"""
