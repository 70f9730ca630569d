"""Comm hooks: how a bucket of gradients is reduced. `hook(state, bucket) -> handle with wait()`."""
