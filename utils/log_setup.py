"""Logging for the entry points: configured once, so the library modules' loggers are seen.

The model logs which kernel runs each op, DDP its bucket map (DEBUG: shown with --verbose);
without a handler Python drops INFO records, so every script calls `configure_logging` first.
Only the main process logs below WARNING: N ranks repeating one line help nobody.
"""

from __future__ import annotations

import logging


def configure_logging(verbose: bool = False, is_main: bool = True) -> None:
    """Set the root level; add a stderr handler unless one is there (a host program's, or
    pytest's), so calling it again or from a test adds no duplicate lines."""
    root = logging.getLogger()
    root.setLevel((logging.DEBUG if verbose else logging.INFO) if is_main else logging.WARNING)
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
