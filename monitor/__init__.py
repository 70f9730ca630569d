"""`monitor_process.py`'s parts: one attempt of the run (attempt.py: start, watch, kill), the
process tree it starts and kills (process_tree.py) and its event log (event_log.py). What it
reads from the run directory comes through utils/run_directory.py. Nothing here imports the
trainer: the monitor only runs a command and reads files."""
