"""fedur-report's label-free tables of a run (docs/label-free.md): each client's estimated accuracy beside its true one,
how far each estimator is from the truth, the model each client chose without labels with the regret, and the
calibration. From metrics.jsonl's and zero_shot.json's numbers (fedur/evaluation/choice.py), so a run still going is
reported too."""

from __future__ import annotations

from fedur.evaluation.choice import estimator_errors
from fedur.evaluation.estimators import ESTIMATORS
from fedur.metrics import fmt, mean


def _pct(value: float | None) -> str:
    return fmt(value, missing="")


def _training(rows: list[dict]) -> list[int]:
    new = set(rows[-1].get("new_clients") or [])
    return [k for k in range(len(rows[-1]["client_accuracy"])) if k not in new]


def estimate_rows(rows: list[dict], zero_shot: dict) -> tuple[str, list[list[str]]]:
    """(the estimator, one row per client): zero-shot's and the last round's personal and server estimates beside the
    true accuracies; [] without estimates."""
    last = rows[-1].get("estimated_accuracy") if rows else None
    if not last:
        return "", []
    name = last.get("estimator") or next(iter(ESTIMATORS))
    personal = (last.get("personal") or {}).get(name) or []
    server = (last.get("server") or {}).get(name) or []
    before = (zero_shot.get("zero_shot_estimated_accuracy") or {}).get(name) or []
    true_server = rows[-1].get("server_client_accuracy") or []
    out = []
    for k, accuracy in enumerate(rows[-1]["client_accuracy"]):
        at = lambda values, k=k: values[k] if k < len(values) else None  # noqa: E731
        out.append([str(k), _pct(at(before)), _pct(at(zero_shot.get("zero_shot_client_accuracy") or [])),
                    _pct(at(personal)), _pct(accuracy), _pct(at(server)), _pct(at(true_server))])
    return name, out


def error_rows(rows: list[dict], zero_shot: dict) -> list[list[str]]:
    """Each estimator's mean absolute error (points) and rank correlation over the rounds, where labels exist."""
    if not rows or rows[-1].get("estimated_accuracy") is None or all(a is None for a in rows[-1]["client_accuracy"]):
        return []
    errors = estimator_errors(rows, zero_shot, list(ESTIMATORS), _training(rows))
    return [[name, *(fmt(e["mae"][m], missing="") for m in ("personal", "server", "zero_shot")),
             *(fmt(e["rank_correlation"][m], missing="") for m in ("personal", "server"))] for name, e in errors.items()
            if any(v is not None for part in e.values() for v in part.values())]  # an estimator the run recorded


def choice_rows(rows: list[dict], zero_shot: dict, summary: dict | None) -> tuple[dict, list[list[str]]]:
    """The label-free choice of a finished run (summary.json's, with evaluation.select label_free) per client, and the
    mean and the worst over the training clients."""
    choice = (summary or {}).get("label_free_choice")
    if not choice:
        return {}, []
    out = []
    for c in choice["clients"]:
        picked = f"{c['model']} @ {c['round']}" if c["model"] else ""
        oracle = f"{c['oracle_model']} @ {c['oracle_round']}" if c["oracle_model"] else ""
        out.append([str(c["client"]), picked, _pct(c["estimate"]), _pct(c["accuracy"]), _pct(c["final_accuracy"]),
                    _pct(c["zero_shot_accuracy"]), oracle, _pct(c["oracle_accuracy"])])
    for what in ("mean", "worst"):
        out.append([what, "", "", *(_pct(choice.get(f"{m}_{what}")) for m in ("chosen", "final", "zero_shot")), "",
                    _pct(choice.get(f"oracle_{what}"))])
    return choice, out


def calibration_row(rows: list[dict], zero_shot: dict) -> list[str]:
    """The last round's mean ECE of the personal models, the server's ECE, zero-shot's mean ECE; [] without labels."""
    last = rows[-1].get("ece") if rows else None
    if not last:
        return []
    return [_pct(mean(last["personal"])), _pct(last.get("server")), _pct(mean(zero_shot.get("zero_shot_ece") or []))]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cell.replace("|", "/") for cell in line) + " |" for line in lines)


def sections(rows: list[dict], zero_shot: dict, summary: dict | None) -> list[str]:
    """The Markdown parts of one run's label-free tables (none for a run without estimates)."""
    name, estimated = estimate_rows(rows, zero_shot)
    if not estimated:
        return []
    parts = [f"Accuracy estimated without labels ({name}, docs/label-free.md), after the last round, beside the true "
             "accuracy:\n\n" + table(["client", "zero-shot est.", "zero-shot", "personal est.", "personal", "server est.",
                                      "server"], estimated)]
    errors = error_rows(rows, zero_shot)
    if errors:
        parts.append("Each estimator's error: mean absolute error (points) over the clients and rounds, and rank "
                     "correlation over the rounds (mean over the clients):\n\n" + table(
                         ["estimator", "MAE personal", "MAE server", "MAE zero-shot", "rank corr. personal",
                          "rank corr. server"], errors))
    choice, chosen = choice_rows(rows, zero_shot, summary)
    if chosen:
        regret = "" if choice.get("regret") is None else f"; regret (oracle mean - chosen mean) {fmt(choice['regret'])} points"
        parts.append(f"The model each client chose without labels ({choice['estimator']}{regret}):\n\n" + table(
            ["client", "chosen @ round", "estimate", "accuracy", "final", "zero-shot", "oracle @ round", "oracle"], chosen))
    calibration = calibration_row(rows, zero_shot)
    if calibration:
        parts.append("Expected calibration error (%, 15 bins; reliability.png):\n\n" + table(
            ["personal (mean)", "server", "zero-shot (mean)"], [calibration]))
    return parts
