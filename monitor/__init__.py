"""`monitor_process.py`'s helpers: the process tree it starts and kills (process_tree.py), and
what it reads from a run directory to judge progress (run_progress.py). Nothing here imports
the trainer: the monitor only runs a command and reads files."""
