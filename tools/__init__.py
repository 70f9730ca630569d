"""Command-line tools around the pipeline: `python -m tools.demo` (the whole pipeline on the
demo corpus), `tools.demo_eval` (task accuracy), `tools.evaluate` (loss / perplexity / bits per
byte of a model on text files, and lm-evaluation-harness through `tools.lm_eval_model` on the
tasks in `tools/lm_eval_tasks/`), `tools.inspect_batch` (look at a training batch),
`tools.resplot` (plots of a run)."""
