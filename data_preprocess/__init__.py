"""Offline preprocessing: raw text -> token files (.bin/.idx) and sample indices (.ibin).

Files, in reading order:
- indexed_dataset.py: the Megatron MMIDIDX `.bin`/`.idx` format, with a byte-level worked
  example, its writer and its memory-mapped reader;
- file_jobs.py: one job per input file, its mirrored output prefix, the output folder's claim
  (shared by the pretokenizers and the clean stage);
- worker_pool.py -> tokenizer_workers.py: an ordered pool of workers that die with the
  program, and the pretokenizers' workers that each hold a tokenizer;
- pipeline.py: what every pretokenize command shares (one output pair per input file, skip
  finished files, an ordered pool of tokenizer workers, crash safety, the run report);
- pretokenize_pretrain_data.py: pretraining text -> documents ending in `<|endoftext|>`;
- build_pretrain_sample_index_map.py: the `.ibin` index of L+1-token training windows and the
  seeded train/valid split, with a worked example;
- chat_records.py -> pretokenize_chat.py: SFT/DPO record shapes -> ChatML ids + loss masks
  (`pretokenize_sft_data.py` / `pretokenize_dpo_data.py` are its two commands).
"""
