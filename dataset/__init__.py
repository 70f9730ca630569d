"""Memory-mapped datasets for pretraining, SFT and DPO, and a checkpointable sampler.

Files, in reading order:
- dataset_pretrain.py: `PretokDatasetWithIndex`, windows of the token stream found via `.ibin`;
- chat_store.py: pretokenized SFT/DPO samples on disk and their train/valid split;
- dataset_sft.py / dataset_dpo.py: samples -> shifted labels (-100 off the replies), collators;
- sampler.py: `StatefulDistributedSampler`, the data order as a pure function of
  (seed, epoch, position), resumable in O(1) under any world size;
- prepare.py + build.py: what the trainer calls; rank 0 prepares an index or cache once
  while the other ranks wait on a done-file.
"""
