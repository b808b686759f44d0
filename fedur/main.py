"""The `fedur` command as a script, for launchers that take a file (the command itself is fedur/app/main.py):

    fabric run --devices 8 fedur/main.py --config configs/cub.yaml [--group.key value ...]
    python fedur/main.py --config configs/smoke.yaml            (Fabric launches the ranks itself)
    python -m fedur.main --config configs/smoke.yaml
"""

import time

ENTERED = time.time()  # before any import of fedur's: where a process without /proc counts its start from

import os  # noqa: E402
import sys  # noqa: E402

if __package__ in (None, ""):  # run as a script: keep fedur/'s folders from shadowing top-level modules
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from fedur.app.main import main  # noqa: E402

if __name__ == "__main__":
    main(entered=ENTERED)
