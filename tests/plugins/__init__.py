"""Plugins of the tests' own, outside fedur's package: a labeller and a method that describe themselves
(described.py, tests/test_plugin_description.py). The plugins a user copies are in examples/."""
