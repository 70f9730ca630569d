"""The training script's parts; `train_my_ddp.py` is parse -> build -> loop -> close on top.

Reading order:
options.py (every knob, one dataclass per group; the data group is dataset/data_config.py) ->
option_validation.py, command_line.py, config_files.py (checks, --help, files, --resume merge)
-> distributed_env.py (ranks, device, threads) -> shared_filesystem.py (several nodes: does
every rank see rank 0's run dir and inputs?) -> model_setup.py (fresh / init_from / resumed
model) -> parallelize.py (our DDP, the optimizer, the comm hook: where parallelism plans plug
in; on a tensor/pipeline grid model_parallel.py with grid_optimizer.py and pipelined_forward.py;
data_share.py: which batches a rank reads; sequence_sharding.py: context parallelism's hook) ->
forward_steps.py (a batch -> a loss, per task; DPO's in dpo_loss.py) -> lr_schedule.py ->
evaluation.py -> metrics.py, trackers.py, throughput.py, progress.py (what the log and the bar
say) -> rng_state.py, training_checkpoint.py (what a checkpoint keeps) -> setup.py (`build_run`:
all of the above, in order, incl. the resume fallback) -> loop_actions.py (evaluate, checkpoint,
log, report: one call each in the loop) -> run_claim.py (one trainer per run dir: rank 0's claim,
by utils/run_ownership.py's rules, held for the run) -> stop_signal.py (a graceful stop) ->
report.py.
"""
