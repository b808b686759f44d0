"""The model each client keeps, chosen without labels, and how far each estimator can be trusted, from the numbers a
run records (metrics.jsonl's rows, zero_shot.json): plain Python, read by the run's summary, fedur-report,
fedur-tables and benchmarks/label_free.py alike.

A client's candidates, in this order: zero-shot CLIP (round 0), then for every round r its personal model and the
server's model after round r. The label-free choice is the first candidate with the highest estimate (`choose`; a
candidate without one is passed over); the oracle is the first with the highest true test accuracy. The run keeps the
chosen model's pieces as it goes (fedur/train/label_free.py compares the same numbers in the same order)."""

from __future__ import annotations

from dataclasses import dataclass

MODELS = ("zero_shot", "personal", "server")


@dataclass(frozen=True)
class Candidate:
    model: str  # zero_shot, personal or server
    round: int  # rounds completed (0: zero-shot CLIP)
    estimate: float | None  # the estimator's value (%)
    accuracy: float | None  # the true test accuracy (%; None without test labels)


def rounds_completed(rows: list[dict]) -> list[int]:
    """Each row's round counted from 1 (a run from before fedur counted rounds from 1 started at 0)."""
    first = rows[0]["round"] if rows else 1
    return [r["round"] + 1 - first for r in rows]


def _at(values, k: int):
    return None if values is None or k >= len(values) else values[k]


def candidates(rows: list[dict], zero_shot: dict, client: int, estimator: str) -> list[Candidate]:
    """Client `client`'s candidates with `estimator`'s estimates and their true accuracies, in the order of `choose`."""
    out = [Candidate("zero_shot", 0, _at((zero_shot.get("zero_shot_estimated_accuracy") or {}).get(estimator), client),
                     _at(zero_shot.get("zero_shot_client_accuracy"), client))]
    for number, row in zip(rounds_completed(rows), rows):
        estimated = row.get("estimated_accuracy") or {}
        for model, accuracy in (("personal", row.get("client_accuracy")), ("server", row.get("server_client_accuracy"))):
            values = estimated.get(model)
            if values is None:
                continue
            out.append(Candidate(model, number, _at(values.get(estimator), client), _at(accuracy, client)))
    return out


def choose(found: list[Candidate], by: str = "estimate") -> Candidate | None:
    """The first candidate with the highest `by` ("estimate" or "accuracy", the oracle); None when none has one."""
    best = None
    for c in found:
        value = getattr(c, by)
        if value is not None and (best is None or value > getattr(best, by)):
            best = c
    return best


def label_free_choice(rows: list[dict], zero_shot: dict, estimator: str, training: list[int] | None = None) -> dict:
    """summary.json's label_free_choice: per client the chosen candidate (model, round, estimate), and where labels
    exist its true accuracy beside the final personal model's, zero-shot's and the oracle choice's; the mean and the
    worst of each over the training clients (`training`: their ids; default all), and the regret (the oracle's mean -
    the choice's)."""
    if not rows:
        return {}
    num_clients = len(rows[-1]["client_accuracy"])
    training = list(range(num_clients)) if training is None else training
    clients = []
    for k in range(num_clients):
        found = candidates(rows, zero_shot, k, estimator)
        chosen, oracle = choose(found), choose(found, "accuracy")
        clients.append({
            "client": k, "model": None if chosen is None else chosen.model, "round": None if chosen is None else chosen.round,
            "estimate": None if chosen is None else chosen.estimate, "accuracy": None if chosen is None else chosen.accuracy,
            "final_accuracy": rows[-1]["client_accuracy"][k], "zero_shot_accuracy": found[0].accuracy,
            "oracle_model": None if oracle is None else oracle.model, "oracle_round": None if oracle is None else oracle.round,
            "oracle_accuracy": None if oracle is None else oracle.accuracy,
        })
    out: dict = {"estimator": estimator, "clients": clients}
    for name, key in (("chosen", "accuracy"), ("final", "final_accuracy"), ("zero_shot", "zero_shot_accuracy"),
                      ("oracle", "oracle_accuracy")):
        values = [clients[k][key] for k in training]
        present = None if any(v is None for v in values) or not values else values
        out[f"{name}_mean"] = None if present is None else sum(present) / len(present)
        out[f"{name}_worst"] = None if present is None else min(present)
    out["regret"] = None if out["oracle_mean"] is None or out["chosen_mean"] is None else out["oracle_mean"] - out["chosen_mean"]
    estimates = [clients[k]["estimate"] for k in training]
    out["chosen_estimate_mean"] = None if not estimates or None in estimates else sum(estimates) / len(estimates)
    out["below_zero_shot"] = [k for k in training if clients[k]["accuracy"] is not None
                              and clients[k]["zero_shot_accuracy"] is not None
                              and clients[k]["accuracy"] < clients[k]["zero_shot_accuracy"]]
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation of two equally long lists (ties: mean ranks); None for fewer than 3 points or a
    constant list (no order to correlate)."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def estimator_errors(rows: list[dict], zero_shot: dict, estimators: list[str], training: list[int] | None = None) -> dict:
    """How far each estimator is from the true test accuracy, where labels exist: {estimator: {"mae": {model: mean over
    the rounds of the mean absolute error over the training clients (pp)}, "final_mae": {model: the last round's},
    "rank_correlation": {model: mean over the clients of Spearman's correlation over the rounds of estimate and
    accuracy}}} for the personal and the server's model (zero-shot: its mae only, it has no rounds); None where a
    model has no estimate or no true accuracy."""
    if not rows:
        return {}
    num_clients = len(rows[-1]["client_accuracy"])
    training = list(range(num_clients)) if training is None else training
    truth = {"personal": [r.get("client_accuracy") for r in rows], "server": [r.get("server_client_accuracy") for r in rows]}
    out = {}
    for name in estimators:
        mae, final, corr = {}, {}, {}
        for model in ("personal", "server"):
            estimated = [((r.get("estimated_accuracy") or {}).get(model) or {}).get(name) for r in rows]
            per_round = [_mae(e, t, training) for e, t in zip(estimated, truth[model])]
            mae[model], final[model] = _mean(per_round), per_round[-1]
            curves = []
            for k in training:
                pairs = [(e[k], t[k]) for e, t in zip(estimated, truth[model])
                         if e is not None and t is not None and e[k] is not None and t[k] is not None]
                curves.append(spearman([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) == len(rows) else None)
            corr[model] = _mean(curves)
        zs = _mae((zero_shot.get("zero_shot_estimated_accuracy") or {}).get(name), zero_shot.get("zero_shot_client_accuracy"),
                  training)
        mae["zero_shot"] = final["zero_shot"] = zs
        out[name] = {"mae": mae, "final_mae": final, "rank_correlation": corr}
    return out


def _mae(estimated: list | None, true: list | None, clients: list[int]) -> float | None:
    if estimated is None or true is None:
        return None
    gaps = [abs(estimated[k] - true[k]) for k in clients
            if k < len(estimated) and k < len(true) and estimated[k] is not None and true[k] is not None]
    return sum(gaps) / len(gaps) if gaps else None
