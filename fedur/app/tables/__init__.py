"""fedur-tables: the paper's tables from one command. Grids (grids.py), the paper's numbers (paper.py),
running and resuming the runs (runner.py, slurm.py) and the Markdown/CSV tables (render.py); docs/tables.md."""
