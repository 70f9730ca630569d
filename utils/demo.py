"""`make demo`: the whole z2all pipeline on the built-in demo corpus, on CPU, in minutes.

Each stage is an ordinary command from the README, run as a subprocess so the demo exercises
exactly what a user types; the demo only strings them together and times them.
"""

from __future__ import annotations

import subprocess
import sys
import time

DEMO = "data/demo"

STAGES: list[tuple[str, list[str]]] = [
    ("build demo corpus", ["-m", "data.build_demo_corpus", "--out", DEMO]),
    ("train byte-level BPE tokenizer", [
        "-m", "tokenizer.train_tokenizer", "--type", "hf", "--input", f"{DEMO}/pretrain",
        "--vocab_size", "8192", "--out", "tokenizer/demo_hf"]),
    ("train sentencepiece tokenizer", [
        "-m", "tokenizer.train_tokenizer", "--type", "sp", "--input", f"{DEMO}/pretrain",
        "--vocab_size", "8192", "--out", "tokenizer/demo_sp"]),
    ("sample encodings", ["-m", "tokenizer.show_encodings", "tokenizer/demo_hf",
                          "tokenizer/demo_sp"]),
]


def main() -> None:
    timings: list[tuple[str, float]] = []
    for name, argv in STAGES:
        print(f"\n=== {name}: python {' '.join(argv)}", flush=True)
        start = time.perf_counter()
        subprocess.run([sys.executable, *argv], check=True)
        timings.append((name, time.perf_counter() - start))
    print("\n=== demo finished; wall time per stage")
    for name, seconds in timings:
        print(f"  {name:<40s} {seconds:8.1f} s")
    print(f"  {'total':<40s} {sum(s for _, s in timings):8.1f} s")


if __name__ == "__main__":
    main()
