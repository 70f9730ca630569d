"""Demo data: a small, deterministic corpus built from installed packages (no network)."""
