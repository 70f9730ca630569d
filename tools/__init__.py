"""Command-line tools around the pipeline: `python -m tools.demo` (the whole pipeline on the
demo corpus), `tools.demo_eval` (task accuracy), `tools.inspect_batch` (look at a training
batch), `tools.resplot` (plots of a run)."""
