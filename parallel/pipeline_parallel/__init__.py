"""Pipeline parallelism: the layers split into stages that pass micro-batches along.

Read in this order: stage.py (what the schedule needs of a stage; our llama's cut is
parallel_plan/llama_pipeline.py), schedules.py (afab and 1f1b, the
point-to-point exchanges, the bubble).
"""
