"""The trainer's parts, wired together by `train_my_ddp.py` (read them right before it).

config.py (every option) -> distributed_env.py (ranks, device, threads) -> model_setup.py
(fresh / init_from / resumed model) -> optimizer_setup.py (DDP, optimizer, comm hook) ->
lr_schedule.py -> evaluation.py -> metrics.py, throughput.py (what the log says) ->
rng_state.py, training_checkpoint.py (what a checkpoint keeps) -> report.py (the report card).
"""
