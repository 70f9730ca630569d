"""`monitor_process.py`'s helpers: the process tree it starts and kills (process_tree.py), and
what it reads from a run directory to judge progress (run_progress.py), and the lock that
keeps it the run's only supervisor (supervisor_lock.py). Nothing here imports the trainer but
its run-dir lock: the monitor only runs a command and reads files."""
