"""Leaves every layer may use: atomic writes, streaming readers and the data files an option
names (folders, `datasets` splits, Hub datasets), the chat template, checkpoint files, the DPO
loss, experiment trackers and the training progress line. A module here imports nothing of ours
except other modules here."""
