"""Test helper: several fedur runs one after the other in the same processes, so that a multi-rank test
pays for `fabric run`'s start once. Each argument is one run's command line as a JSON list.

    fabric run --devices 2 tests/run_many.py '["--config", "configs/tiny.yaml", ...]' '[...]'
"""

import json
import os
import sys

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fedur.app.cli import build_parser  # noqa: E402
from fedur.app.main import main  # noqa: E402

if __name__ == "__main__":
    parser = build_parser(docs=False)  # one for every run: building it is a third of a second
    for argv in sys.argv[1:]:
        main(json.loads(argv), parser)
