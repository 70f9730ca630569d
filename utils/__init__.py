"""Shared plumbing: readers, chat template, checkpoints, logging, plots."""
