"""Robust aggregation of one round's uploads, as pure functions of tensors.

`rows` is a float64 (n, d) tensor, n >= 1: row i the flattened upload of the i-th accepted client (all its shared
pieces concatenated), in client-id order. The rules are Flower's, compared against flwr 1.42.0:

- `coordinate_median`: `aggregate_median` (flwr/server/strategy/aggregate.py, FedMedian, fedmedian.py).
- `trimmed_mean`: `aggregate_trimmed_avg` / `_trim_mean` (aggregate.py, FedTrimmedAvg, fedtrimmedavg.py).
- `krum_scores`, `krum_select`: `aggregate_krum` and `_compute_distances` (aggregate.py, Krum, krum.py).
- `clip_to_norm`: `compute_clip_model_update` / `clip_inputs_inplace` (flwr/supercore/differential_privacy.py in
  1.42.0, flwr/common/differential_privacy.py up to 1.23): norm-difference clipping (Sun et al. 2019, "Can you
  really backdoor federated learning?").
- `median_norm`: np.median of the rows' L2 norms, the clipping bound fedur uses when none is given.

No randomness, and every reduction in a fixed order: along d a pairwise tree of elementwise adds (`_row_sums`, so
the result does not depend on torch's thread count), across the clients a loop in a fixed order. The results are
bitwise reproducible on CPU; they equal Flower's up to rounding (the median's exactly).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(rows: Tensor) -> None:
    if rows.dim() != 2 or rows.shape[0] < 1:
        raise ValueError(f"robust aggregation takes (n >= 1, d) rows, not {tuple(rows.shape)}")  # internal: the server stacks them


def _row_sums(x: Tensor) -> Tensor:
    """(n,): the sums of x's rows (n, m), added pairwise (first half + second half, an odd last column carried)."""
    while x.shape[1] > 1:
        half = x.shape[1] // 2
        head = x[:, :half] + x[:, half:2 * half]
        x = torch.cat([head, x[:, 2 * half:]], dim=1) if x.shape[1] % 2 else head
    return x[:, 0] if x.shape[1] else x.new_zeros(x.shape[0])


def _norms(rows: Tensor) -> Tensor:
    """(n,): the rows' L2 norms."""
    return _row_sums(rows * rows).sqrt()


def coordinate_median(rows: Tensor) -> Tensor:
    """(d,): the median of each coordinate over the n rows, np.median's: the middle value for odd n, the mean
    (a + b) / 2 of the two middle ones for even n (torch.median would give the lower one). Flower's
    `aggregate_median`."""
    _check(rows)
    ordered = rows.sort(dim=0).values
    n = rows.shape[0]
    if n % 2:
        return ordered[n // 2].clone()
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(rows: Tensor, beta: float = 0.2) -> Tensor:
    """(d,): per coordinate, the mean of the rows left after cutting int(beta * n) of the smallest and as many of the
    largest values; beta in [0, 0.5). Flower's `aggregate_trimmed_avg` (FedTrimmedAvg, beta 0.2 by default); the kept
    values are added in ascending order."""
    _check(rows)
    if not 0.0 <= beta < 0.5:
        # internal: the settings check beta before a round gets here
        raise ValueError(f"trimmed_mean's beta is the fraction cut from each end: it must be in [0, 0.5), not {beta} "
                         "(Flower's FedTrimmedAvg; 0.2 is its default, coordinate_median keeps only the middle)")
    n = rows.shape[0]
    cut = int(float(beta) * n)
    if n - 2 * cut < 1:
        raise ValueError(f"trimmed_mean with beta {beta} cuts all {n} rows: lower beta")  # internal: as above
    ordered = rows.sort(dim=0).values
    total = ordered[cut].clone()
    for k in range(cut + 1, n - cut):
        total += ordered[k]
    return total / (n - 2 * cut)


def pairwise_sq_distances(rows: Tensor) -> Tensor:
    """(n, n): ||rows[i] - rows[j]||^2 (Flower's `_compute_distances`), exactly symmetric with a zero diagonal."""
    _check(rows)
    out = rows.new_zeros(rows.shape[0], rows.shape[0])
    for i in range(rows.shape[0]):
        delta = rows - rows[i]
        out[i] = _row_sums(delta * delta)
    return out


def krum_scores(rows: Tensor, num_malicious: int) -> list[float]:
    """Krum's score of each row (Blanchard et al. 2017), as Flower's `aggregate_krum` computes it: with
    k = max(1, n - num_malicious - 2), the sum of the values at positions 1 .. k of the row's sorted squared distances
    to all n rows (itself included). Position 0 is always a zero, the row's own distance or, for a duplicated row, its
    twin's, which leaves the same values; beyond n - 1 the slice just ends (a single row scores 0). The values are
    added in ascending order."""
    if num_malicious < 0:
        raise ValueError(f"num_malicious must be >= 0, not {num_malicious}")  # internal: the settings check it
    dist = pairwise_sq_distances(rows)
    k = max(1, rows.shape[0] - num_malicious - 2)
    scores = []
    for row in dist.sort(dim=1).values.tolist():
        total = 0.0
        for value in row[1:k + 1]:
            total += value
        scores.append(total)
    return scores


def krum_select(rows: Tensor, num_malicious: int, num_to_keep: int = 0) -> list[int]:
    """The rows Krum keeps, as indices into `rows` in ascending score order (`krum_scores`), equal scores by the lower
    index (np.argsort(kind="stable")): [the minimiser] for num_to_keep <= 0 (Krum: Flower returns that row), else the
    num_to_keep best (multi-Krum: Flower averages those rows weighted by num_examples, summing them in the reverse of
    this order). Ties: Flower's Krum takes np.argmin, the lower index, as here; its multi-Krum takes
    np.argsort(scores)'s default kind, which does not keep equal scores in index order where numpy sorts with SIMD
    (seen with numpy 2.4 on an AVX-512 CPU), so for exactly equal scores at the cut Flower may keep the other row
    there. num_to_keep > n is refused (Flower's slice [n - num_to_keep:] would keep num_to_keep - n rows, or all)."""
    n = rows.shape[0]
    if num_to_keep > n:
        raise ValueError(f"multi-Krum cannot keep {num_to_keep} of {n} rows")  # internal: the settings bound it by the clients
    scores = krum_scores(rows, num_malicious)
    order = sorted(range(n), key=lambda i: scores[i])  # stable: equal scores keep index order
    return order[:max(num_to_keep, 1)]


def clip_to_norm(updates: Tensor, max_norm: float) -> Tensor:
    """(n, d): each row scaled by min(1, max_norm / ||row||_2) (Flower's `compute_clip_model_update`, one update at a
    time). A zero row is kept as it is: Flower divides by its zero norm (a ZeroDivisionError for a Python float bound,
    inf and so a factor 1 for a NumPy one)."""
    _check(updates)
    if max_norm < 0:
        raise ValueError(f"a clipping bound must be >= 0, not {max_norm}")  # internal: the settings check it
    norms = _norms(updates)
    scale = torch.where(norms > max_norm, max_norm / norms, torch.ones_like(norms))
    return updates * scale[:, None]


def median_norm(updates: Tensor) -> float:
    """The median of the rows' L2 norms (np.median's: the mean of the two middle ones for even n)."""
    _check(updates)
    return float(coordinate_median(_norms(updates)[:, None])[0])
