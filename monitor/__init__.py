"""`monitor_process.py`'s parts: one attempt of the run (attempt.py: start, watch, kill), the
process tree it starts and kills (process_tree.py), the run's stderr with torchrun's stop
traceback left out (stderr_relay.py), its event log (event_log.py) and the lock that keeps it
the run's only supervisor, or its node's (supervisor_lock.py). What it reads from the run
directory comes through utils/run_directory.py. Nothing here imports the trainer: the monitor
only runs a command and reads files."""
