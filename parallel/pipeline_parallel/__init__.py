"""Pipeline parallelism: the layers split into stages that pass micro-batches along.

Read in this order: stage.py (what a stage holds and runs), schedules.py (afab and 1f1b, the
point-to-point exchanges, the bubble).
"""
