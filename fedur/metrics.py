"""How fedur turns per-client counts into the numbers it reports, shared by the run (train/recorder.py)
and `fedur-report` (report.py): accuracy in %, the mean over the clients that have a value, the best
value of a curve, and their text form."""

from __future__ import annotations

from torch import Tensor


def accuracies(counts: Tensor) -> list[float | None]:
    """Per-client accuracy in % from (K, 2) [correct, total]; None for a client without test images."""
    return [100.0 * float(c) / float(n) if n > 0 else None for c, n in counts.tolist()]


def mean(values: list[float | None]) -> float | None:
    """The mean of the present values (None when there are none): the paper's unweighted client mean."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def pooled(counts: Tensor) -> float | None:
    """Accuracy in % over every test image of the clients in (K, 2) [correct, total]: the mean over clients
    weighted by their test images (None without any)."""
    correct, total = counts.sum(dim=0).tolist()
    return 100.0 * float(correct) / float(total) if total > 0 else None


def harmonic_mean(a: float | None, b: float | None) -> float | None:
    """2ab / (a + b) of two accuracies (FLiP's dual, base-to-novel's H); None when either is missing, 0 when both are 0."""
    if a is None or b is None:
        return None
    return 0.0 if a + b == 0 else 2.0 * a * b / (a + b)


def best(values: list[float | None]) -> tuple[float | None, int | None]:
    """The largest present value and its index (the first on ties); (None, None) when none is present."""
    present = [(v, i) for i, v in enumerate(values) if v is not None]
    return max(present, key=lambda p: p[0]) if present else (None, None)


def fmt(value: float | None, digits: int = 2, missing: str = "n/a") -> str:
    """A number with `digits` decimals, or `missing`."""
    return missing if value is None else f"{value:.{digits}f}"


def round_numbers(rows: list[dict]) -> list[int]:
    """Each metrics.jsonl row's round counted from 1 (rounds completed). Rows count from 1 ("round": 1 is the
    first round); runs from before fedur counted that way started at 0, and are read as such."""
    first = rows[0]["round"] if rows else 1
    return [r["round"] + 1 - first for r in rows]
