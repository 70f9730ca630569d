"""Context parallelism: one long sequence split across the ranks of a group, ring attention.

Read in this order: load_balance.py (which tokens each rank holds, and why two chunks),
block_attention.py (attention on one block of keys with its log-sum-exp, the merge rule and
the backward formulas), flash_blocks.py (the same forward on flash-attn's kernel, and when it
is used), ring_attention.py (the ring: K/V blocks passed rank to rank, forward and backward
written out), context_shard.py (what a model calls to compute on its share of each sequence:
the split, the ring, and the loss made whole with its gradient). Model-agnostic: tensors in,
tensors out, like tensor_parallel/.
"""
