"""fedur's run configs (YAML), shipped inside the package as fedur.configs so that fedur-tables finds them
in an installed fedur as in a checkout (setup.py)."""
