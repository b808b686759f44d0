"""Plugins of a user's own, outside fedur's package: a method and a labeller each written as one file
against fedur's public API (docs/extending.md), selected by their import paths in tests/test_plugins.py."""
