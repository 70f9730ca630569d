"""DPO records -> (prompt + chosen, prompt + rejected) ChatML ids + loss masks.

    python -m data_preprocess.pretokenize_dpo_data --data_dir data/demo/dpo \\
        --tokenizer_dir tokenizer/demo_hf --max_seq_len 256 --out_dir data/demo/dpo_pretok_hf

Optional: training builds the same output online as a cache (dataset/build.py) when given the
raw folder. The format, template and truncation policy: data_preprocess/pretokenize_chat.py.
"""

import functools
import sys

from data_preprocess.pretokenize_chat import main
from utils.cli_errors import run_main

if __name__ == "__main__":
    sys.exit(run_main(functools.partial(main, "dpo")))
