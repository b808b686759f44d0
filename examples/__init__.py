"""Plugins of a user's own, outside fedur's package, each one file against fedur's public API (docs/extending.md):
a method with server momentum, a method with a trainable piece of its own, a pseudo-labeller and a dataset. Copy one
to start your own; run it by its import path from the repository's root (`PYTHONPATH=. python fedur/main.py
--method examples.server_momentum.ServerMomentum ...`). tests/test_examples.py runs each from here."""
