"""The two size flags every benchmark takes, so `make bench BENCH_FLAGS=--quick` (or `--smoke`)
reaches each script the same way:

    --quick   the same measurement, shorter (smaller sizes or fewer repeats); figures still
              worth reading, noisier
    --smoke   seconds, tiny sizes: proves the script runs (tests/test_bench_smoke.py); its
              figures mean nothing

and `--json`: print one JSON object of the figures on stdout, all else on stderr
(bench/figures.py).
"""

from __future__ import annotations

import argparse

from utils.boolean_flags import add_boolean_flag
from utils.option_parser import OptionParser


def bench_parser(description: str, quick: str,
                 smoke: str = "seconds: tiny sizes, only checks that it runs"
                 ) -> argparse.ArgumentParser:
    """A parser with --quick and --smoke (one or the other); `quick` says what it shortens."""
    parser = OptionParser(description=description)
    size = parser.add_mutually_exclusive_group()
    add_boolean_flag(size, "--quick", help=quick)
    add_boolean_flag(size, "--smoke", help=smoke)
    add_boolean_flag(parser, "--json", help="print only one JSON object of the figures on "
                     "stdout (the report goes to stderr): bench/figures.py, bench/table.py")
    return parser
