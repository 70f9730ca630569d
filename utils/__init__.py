"""Leaves every layer may use: atomic writes, streaming readers and the data files an option
names (folders, `datasets` splits, Hub datasets), the chat template, checkpoint files. A module
here imports nothing of ours except other modules here, and has users in more than one package
(a module only the trainer uses lives in trainer/: the DPO loss, trackers, the progress line)."""
