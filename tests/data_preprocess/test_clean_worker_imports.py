"""A clean worker never imports transformers (~0.7 s per process, for a stage that tokenizes
nothing). It forks from a forkserver that preloaded data_preprocess/worker_pool.py and the
forkserver guard, then imports the command's module and the task's (cleaning/analyse.py):
none of them may reach the `tokenizer` package, whose classes are transformers classes. The
pretokenizers' tokenizer state lives apart (data_preprocess/tokenizer_workers.py), and so do
the file jobs both kinds of tool share (data_preprocess/file_jobs.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLEAN_WORKER_MODULES = ("data_preprocess.worker_pool", "data_preprocess.forkserver_guard",
                        "data_preprocess.clean_pretrain_data", "data_preprocess.cleaning.analyse")


def test_a_clean_worker_imports_no_transformers():
    code = (f"import sys; import {', '.join(CLEAN_WORKER_MODULES)}; "
            "print('transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "False", "a clean worker's imports load transformers"
