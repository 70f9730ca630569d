"""SFT records (ShareGPT, OpenAI, Alpaca, TRL prompt/completion) -> ChatML ids + loss masks.

    python -m data_preprocess.pretokenize_sft_data --data_dir data/demo/sft \\
        --tokenizer_dir tokenizer/demo_hf --max_seq_len 256 --out_dir data/demo/sft_pretok_hf

Optional: training can also read the raw files and build the same output as a cache
(dataset/build.py); run this beforehand for large data or to inspect the counts first.
The format, template and truncation policy: data_preprocess/pretokenize_chat.py.
"""

import functools
import sys

from data_preprocess.pretokenize_chat import main
from utils.cli_errors import run_main

if __name__ == "__main__":
    sys.exit(run_main(functools.partial(main, "sft")))
