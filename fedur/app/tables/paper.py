"""The paper's numbers (Liang et al., arXiv 2611.12187, ViT-B/32 unless noted; mean of 3 seeds, %), as data.

`PAPER[table][dataset][setting][row] -> accuracy`. Row keys are the grids' (`fedur/app/tables/grids.py`):
`zeroshot`, `<method>+<labeller>` for the FL baselines (`promptfl+fpl`, `fedotp+codpl`, ...), `fedcopl`,
`fedur`, and the ablation rows of Table 6. Settings: `beta0.1`, `beta0.05`, `quantity`.
`PAPER_AVERAGE[table][setting][row]` is the paper's own "Average" column, kept to check the transcription
(the mean over the datasets must give it back, to rounding: tests/test_tables.py).

Transcribed from the paper's Markdown (`fedur-paper.md`) and cross-checked with ALGORITHM.md section 8.
The paper spells FedOTP "FedOPT" in its tables and calls its zero-shot row "CLIP". Not in the paper:
Figure 3's values (client number and joining-rate sweeps: a plot without numbers), any standard
deviation, and the FL baselines with CoPL labels (`<method>+copl`).
"""

from __future__ import annotations

DATASETS_T1 = ("dtd", "resisc45", "cub", "ucf101", "cifar10", "cifar100")


def _by_dataset(rows: dict[str, tuple[float, ...]], datasets: tuple[str, ...], settings: tuple[str, ...]) -> dict:
    """Rows as printed (dataset-major, then setting; a trailing Average per setting) -> nested dicts."""
    width = len(datasets) * len(settings)
    table: dict = {d: {s: {} for s in settings} for d in datasets}
    for row, values in rows.items():
        assert len(values) in (width, width + len(settings)), (row, len(values))
        for i, value in enumerate(values[:width]):
            table[datasets[i // len(settings)]][settings[i % len(settings)]][row] = value
    return table


def _averages(rows: dict[str, tuple[float, ...]], datasets: tuple[str, ...], settings: tuple[str, ...]) -> dict:
    width = len(datasets) * len(settings)
    out: dict = {s: {} for s in settings}
    for row, values in rows.items():
        for j, value in enumerate(values[width:]):
            out[settings[j]][row] = value
    return out


# Table 1: Dirichlet label skew. Columns: DTD, RESISC45, CUB, UCF101, CIFAR10, CIFAR100, Average,
# each beta 0.1 then beta 0.05.
_TABLE1 = {
    "zeroshot":        (43.24, 43.24, 54.51, 54.51, 51.28, 51.28, 61.00, 61.00, 86.93, 86.93, 64.17, 64.17, 60.19, 60.19),
    "promptfl+fpl":    (45.79, 44.62, 59.76, 58.05, 47.29, 46.16, 64.39, 62.96, 87.51, 85.02, 63.26, 62.56, 61.33, 59.90),
    "promptfl+cpl":    (44.84, 46.32, 62.52, 60.99, 48.72, 48.86, 63.86, 64.97, 88.90, 89.14, 66.04, 65.14, 62.48, 62.57),
    "promptprox+fpl":  (45.15, 43.88, 59.36, 58.59, 47.04, 47.01, 62.91, 61.27, 87.13, 85.62, 62.77, 64.12, 60.73, 60.08),
    "promptprox+cpl":  (43.51, 45.85, 59.99, 62.35, 49.25, 48.65, 64.55, 63.94, 90.44, 90.07, 65.86, 66.15, 62.27, 62.84),
    "pfedprompt+fpl":  (44.56, 46.19, 65.95, 60.52, 48.48, 44.42, 64.37, 64.18, 87.45, 90.72, 65.08, 65.83, 62.65, 61.98),
    "pfedprompt+cpl":  (44.22, 47.59, 61.76, 66.79, 47.23, 50.97, 65.59, 65.44, 90.26, 89.10, 65.63, 67.86, 62.45, 64.63),
    "fedotp+fpl":      (51.97, 48.71, 57.76, 55.62, 47.99, 47.05, 61.83, 64.56, 91.32, 90.73, 67.51, 66.50, 63.06, 62.20),
    "fedotp+cpl":      (37.43, 39.33, 51.10, 48.47, 46.61, 45.07, 58.93, 57.12, 91.08, 91.36, 57.87, 59.81, 57.17, 56.86),
    "fedcopl":         (60.89, 66.37, 75.76, 80.26, 56.09, 54.80, 73.20, 74.97, 95.38, 95.11, 73.59, 72.84, 72.49, 74.06),
    "fedur":           (62.75, 69.30, 78.61, 82.01, 57.63, 55.09, 74.29, 76.75, 96.41, 96.06, 73.81, 73.54, 73.92, 75.46),
}

# Table 2: quantity-based label skew (each client 20% of the classes). Columns as Table 1, one setting.
_TABLE2 = {
    "zeroshot":        (43.24, 54.51, 51.28, 61.00, 86.93, 64.17, 60.19),
    "promptfl+fpl":    (43.53, 57.53, 46.66, 62.35, 88.29, 63.94, 60.38),
    "promptfl+cpl":    (43.82, 61.11, 47.31, 64.23, 88.70, 67.23, 62.07),
    "promptprox+fpl":  (44.89, 56.71, 48.74, 61.80, 85.69, 64.01, 60.31),
    "promptprox+cpl":  (45.53, 60.77, 47.61, 63.86, 89.21, 66.49, 62.25),
    "pfedprompt+fpl":  (45.09, 60.46, 47.71, 65.39, 87.54, 62.82, 61.50),
    "pfedprompt+cpl":  (45.14, 66.68, 50.45, 65.57, 87.98, 65.45, 63.55),
    "fedotp+fpl":      (47.65, 56.04, 46.61, 62.95, 90.74, 66.76, 61.79),
    "fedotp+cpl":      (40.24, 47.09, 44.00, 57.24, 89.21, 57.98, 55.96),
    "fedcopl":         (56.18, 81.06, 56.31, 72.03, 94.86, 73.39, 72.31),
    "fedur":           (58.60, 82.56, 57.66, 72.56, 95.03, 73.60, 73.34),
}

# Table 6: ablation, Dirichlet beta 0.1; DTD, RESISC45, CUB, UCF101. The paper's check marks
# (Data selection, Confidence, Entropy, Weighted, Negative) per row are in grids.py::ABLATION.
_TABLE6 = {
    "no-selection":   (40.30, 52.91, 44.94, 51.35),
    "selection":      (49.20, 65.32, 54.73, 68.73),
    "sel+entropy":    (60.02, 74.92, 54.80, 71.51),
    "sel+confidence": (57.25, 77.16, 51.61, 72.52),
    "fedcopl":        (60.89, 75.76, 56.09, 73.20),  # both filters, no weights, no negatives = FedCoPL
    "fedcopl+neg":    (62.00, 78.42, 56.73, 73.41),
    "fedcopl+weight": (62.04, 78.20, 57.23, 74.09),
    "fedur":          (62.75, 78.61, 57.63, 74.29),
}

# Table 7: each FL baseline with its better labeller of Table 1 (as the paper printed it) and with
# CoDPL (FedUR's labels), Dirichlet beta 0.1; DTD, RESISC45, CUB, UCF101, CIFAR10. The paper prints the
# gain in parentheses; it is the difference of the two rows (checked in the tests).
_TABLE7 = {
    "promptfl+cpl":     (44.84, 62.52, 48.72, 63.86, 88.90),
    "promptfl+codpl":   (48.77, 64.35, 49.15, 65.71, 91.82),
    "promptprox+cpl":   (43.51, 59.99, 49.25, 64.55, 90.44),
    "promptprox+codpl": (48.09, 62.73, 49.80, 66.14, 91.91),
    "pfedprompt+fpl":   (44.56, 65.95, 48.48, 64.37, 87.45),
    "pfedprompt+codpl": (49.67, 68.56, 52.92, 68.23, 91.97),
    "fedotp+fpl":       (51.97, 57.76, 47.99, 61.83, 91.32),
    "fedotp+codpl":     (60.07, 78.03, 56.49, 70.07, 94.75),
}
# The gains Table 7 prints beside each CoDPL row.
TABLE7_GAINS = {
    "promptfl+codpl":   (3.93, 1.83, 0.43, 1.85, 2.92),
    "promptprox+codpl": (4.58, 2.74, 0.55, 1.59, 1.47),
    "pfedprompt+codpl": (5.11, 2.61, 4.44, 3.86, 4.52),
    "fedotp+codpl":     (8.10, 20.27, 8.50, 8.24, 3.43),
}

# Table 8: ViT-B/16, Dirichlet beta 0.1; DTD, RESISC45, CUB, UCF101 (no grid yet; configs/paper/table8).
_TABLE8 = {
    "zeroshot":       (42.87, 56.61, 55.16, 65.13),
    "promptfl+fpl":   (44.36, 61.36, 51.95, 64.60),
    "promptprox+fpl": (47.12, 61.01, 49.44, 65.31),
    "pfedprompt+fpl": (47.65, 63.18, 50.19, 65.19),
    "fedotp+fpl":     (46.52, 58.94, 49.67, 65.68),
    "fedcopl":        (56.83, 77.50, 59.78, 78.29),
    "fedur":          (59.69, 81.06, 59.94, 78.61),
}

PAPER: dict[str, dict[str, dict[str, dict[str, float]]]] = {
    "table1": _by_dataset(_TABLE1, DATASETS_T1, ("beta0.1", "beta0.05")),
    "table2": _by_dataset(_TABLE2, DATASETS_T1, ("quantity",)),
    "table6": _by_dataset(_TABLE6, DATASETS_T1[:4], ("beta0.1",)),
    "table7": _by_dataset(_TABLE7, DATASETS_T1[:5], ("beta0.1",)),
    "table8": _by_dataset(_TABLE8, DATASETS_T1[:4], ("beta0.1",)),
}
PAPER_AVERAGE: dict[str, dict[str, dict[str, float]]] = {
    "table1": _averages(_TABLE1, DATASETS_T1, ("beta0.1", "beta0.05")),
    "table2": _averages(_TABLE2, DATASETS_T1, ("quantity",)),
}

# Figure 3 (numbers of clients; joining rates) on UCF101, RESISC45, CIFAR10, CIFAR100 at beta 0.1 is a
# plot: the paper prints no values, not even the x-axis ticks in its text.
FIGURE3: dict = {}


def paper_value(table: str | None, dataset: str, setting: str, row: str) -> float | None:
    """The paper's number for one cell, or None where the paper has none."""
    if table is None:
        return None
    return PAPER.get(table, {}).get(dataset, {}).get(setting, {}).get(row)
