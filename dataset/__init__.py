"""Memory-mapped datasets for pretraining, SFT and DPO, and a checkpointable sampler.

Files, in reading order:
- dataset_pretrain.py: `PretokDatasetWithIndex`, windows of the token stream found via `.ibin`;
- chat_store.py: pretokenized SFT/DPO samples on disk and their train/valid split;
- dataset_sft.py / dataset_dpo.py: samples -> shifted labels (-100 off the replies), collators;
- sampler.py: `StatefulDistributedSampler`, the data order as a pure function of
  (seed, epoch, position), resumable in O(1) under any world size;
- prepare.py + build.py: what the trainer calls; rank 0 prepares an index or cache once
  while the other ranks wait on a done-file.
The streaming path (--data_format=stream: raw shards, tokenized on the fly, exact resume):
- stream_shards.py: sources (--data_mix), seeded shard order, each worker's share;
- stream_samples.py: records -> packed windows / chat samples, each with its position;
- shuffle_buffer.py: a bounded shuffle whose state is its contents plus a draw count;
- stream.py: workers hand out chunks with positions; the main process shuffles, batches
  and holds the exact state.
"""
