"""The histogram attack (fedur-attack, docs/privacy-attacks.md): what the server learns of a client's label
distribution from the pseudo-label histograms it receives at each refresh, as the total-variation distance between
the client's true class shares (partition.json) and the server's estimate of them. Pure functions of the run's
records.

The estimate is what the run's privacy mode lets the server see (metrics.jsonl's refresh lines):
- none: each client's uploaded histogram as it is ("released_histograms"; runs that do not record it: its selected
  counts "selection", which every client uploads too);
- local: each client's noised histogram ("released_histograms"), its negative counts read as 0;
- central: only the noised sum over the clients ("released_totals"), so one estimate for every client: the global
  shares.
"""

from __future__ import annotations

import numpy as np

RELEASED_ROWS, RELEASED_SUM, SELECTION = "released_histograms", "released_totals", "selection"


def shares(counts) -> np.ndarray:
    """(..., C) class shares of (noised) counts: negatives read as 0, each row over its sum (uniform where nothing
    is left: the estimate of a server that learnt nothing)."""
    counts = np.clip(np.asarray(counts, dtype=np.float64), 0.0, None)
    total = counts.sum(axis=-1, keepdims=True)
    uniform = np.full_like(counts, 1.0 / counts.shape[-1])
    return np.where(total > 0, counts / np.where(total > 0, total, 1.0), uniform)


def total_variation(p, q) -> np.ndarray:
    """(...,) the total-variation distance 1/2 sum_c |p_c - q_c| of class shares (0: the same; 1: disjoint)."""
    return 0.5 * np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)).sum(axis=-1)


def server_estimate(line: dict, mode: str, num_clients: int) -> tuple[np.ndarray | None, str]:
    """((K, C) the server's estimate of every client's class shares at the refresh of metrics.jsonl's `line`, or None
    where the line does not record what was released; where it came from, or what is missing)."""
    rows, total, selection = line.get(RELEASED_ROWS), line.get(RELEASED_SUM), line.get(SELECTION)
    if mode != "none" and RELEASED_SUM in line and total is None and rows is None and selection is not None:
        classes = len(selection[0])  # privacy on, no histogram released (a labeller that needs none): nothing learnt
        return np.full((num_clients, classes), 1.0 / classes), "nothing released at this refresh: uniform shares"
    if mode == "central":
        if total is not None:
            return np.repeat(shares(total)[None], num_clients, axis=0), f"{RELEASED_SUM}: the noised sum, the global shares"
        if selection is not None:  # the released sum's noise-free counterpart
            summed = np.asarray(selection, dtype=np.float64).sum(axis=0)
            return np.repeat(shares(summed)[None], num_clients, axis=0), \
                f"{SELECTION} summed over the clients (no {RELEASED_SUM} recorded: the noise-free global shares)"
        return None, f"no {RELEASED_SUM} (the noised sum) nor {SELECTION} recorded"
    if rows is not None:
        return shares(rows), f"{RELEASED_ROWS}: each client's " + ("noised histogram" if mode == "local" else "upload")
    if mode == "local":
        return None, f"no {RELEASED_ROWS} recorded (each client's noised histogram): it cannot be rebuilt"
    if selection is not None:
        return shares(selection), f"{SELECTION}: each client's selected counts (no {RELEASED_ROWS} recorded)"
    return None, f"no {RELEASED_ROWS} nor {SELECTION} recorded"


def refresh_lines(rounds: list[dict]) -> list[dict]:
    """metrics.jsonl's lines of a refresh (they carry the histograms)."""
    return [r for r in rounds if r.get(SELECTION) is not None or r.get(RELEASED_ROWS) is not None
            or r.get(RELEASED_SUM) is not None]


def histogram_attack(true_counts, rounds: list[dict], mode: str, training: list[int]) -> dict:
    """histograms.json: per training client (`training`: their ids) the total-variation distance between its true
    class shares (`true_counts` (K, C), partition.json's train) and the server's estimate at the last refresh and at
    every refresh (`rounds`: metrics.jsonl), beside two guesses that need no release: uniform shares and the true
    global shares of the training clients' images."""
    truth = shares(true_counts)  # (K, C)
    prior = shares(np.asarray(true_counts, dtype=np.float64)[training].sum(axis=0))  # (C,)
    per_refresh, missing = [], []
    for line in refresh_lines(rounds):
        estimate, source = server_estimate(line, mode, len(truth))
        if estimate is None:
            missing.append({"round": line.get("round"), "missing": source})
            continue
        distance = total_variation(truth[training], estimate[training])
        per_refresh.append({"round": line.get("round"), "source": source, "tv": [float(d) for d in distance],
                            "mean_tv": float(distance.mean())})
    last = per_refresh[-1] if per_refresh else None
    clients = [{"client": k, "tv": None if last is None else last["tv"][i],
                "tv_uniform": float(total_variation(truth[k], np.full(truth.shape[1], 1.0 / truth.shape[1]))),
                "tv_global": float(total_variation(truth[k], prior))} for i, k in enumerate(training)]
    return {"privacy": mode, "round": None if last is None else last["round"], "source": None if last is None else last["source"],
            "mean_tv": None if last is None else last["mean_tv"],
            "mean_tv_uniform": float(np.mean([c["tv_uniform"] for c in clients])) if clients else None,
            "mean_tv_global": float(np.mean([c["tv_global"] for c in clients])) if clients else None,
            "clients": clients, "per_refresh": per_refresh, "missing": missing}
