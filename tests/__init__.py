"""The test suite mirrors the packages: the tests of `<package>/<module>.py` live in
`tests/<package>/test_<module>.py` (a root script's tests go to its closest package, e.g.
`train_my_ddp.py` in `tests/trainer/`, `monitor_process.py` in `tests/monitor/`).

What stays at this root crosses packages, so no one folder owns it:
- `test_layers.py` (the import order of every package), `test_no_code_from_folders.py` (no tool
  executes a file from a tokenizer/model folder), `test_reliability.py` (bad inputs and faults
  at every stage, end to end), `test_bench_smoke.py` (every bench), `test_gpu_check.py`
  (`make gpu-check`: model, optimizer and parallel code on a real GPU);
- `conftest.py` (session-wide tiny tokenizers), `train_helpers.py` (a tiny training run, used
  by trainer, monitor and reliability tests), `megatron_spec_reader.py` (the independent reader
  of the token-file format, used by data_preprocess and tools tests), `fake_gpu_libs/`.
Helpers that benches share live in the packages instead (`parallel/local_ranks.py`,
`data/toy_corpus.py`), so nothing outside `tests/` imports from it.
"""
