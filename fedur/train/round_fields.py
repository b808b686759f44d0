"""The fields of a round: each key of a metrics.jsonl line declared once, with what it is, when a line has it, the
TensorBoard scalars it becomes, its piece of the round line and where fedur-report shows it.

`round_metrics.round_record` computes the values and refuses a key not declared here; the recorder
(train/recorder.py) turns a row into TensorBoard scalars and the round line through these declarations, and
fedur-report (app/report.py) builds its per-round tables and its protocols from them. docs/outputs.md's table of
the fields is generated from them: `python -m fedur.train.round_fields` prints it.

A new metric is its value in `round_record` and one `Field` below (the tests check that the two agree and that
docs/outputs.md has the generated table). The order of FIELDS is the order of the pieces on the round line, of the
columns in fedur-report's tables and of the rows in the docs; the order of a metrics.jsonl line is round_record's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fedur.metrics import fmt, mean

How = Literal["value", "mean", "max", "sum", "count", "so far", "per client", "per class", "per name",
              "mean per name"]


@dataclass(frozen=True)
class Scalars:
    """One TensorBoard tag and how a row's value becomes its scalars. In `tag`, XXX stands for a client id, CCC for a
    class index and NAME for a dict's key (":" written "_"; a dict of dicts: key_subkey).

    how: "value" as it is; "mean" over the clients that have one; "max" of a list (none if empty); "sum" over the
    clients (none if a client has none); "count" of the ids; "so far" the sums of this and every earlier round of the
    run; "per client", "per class" one tag per entry of a list; "per name" one per key of a dict; "mean per name" one
    per key of a dict, a list's mean over the clients that have a value (a text is left out)."""

    tag: str
    how: How = "value"

    def of(self, value: Any, earlier: Sequence[Any] = ()) -> dict[str, float | None]:
        """{tag: scalar} of `value` (`earlier`: the field's values in the run's earlier rounds, for "so far")."""
        if self.how == "value":
            return {self.tag: value}
        if self.how == "mean":
            return {self.tag: mean(value or [])}
        if self.how == "max":
            return {self.tag: max(value) if value else None}
        if self.how == "sum":
            return {self.tag: None if value is None or None in value else sum(value)}
        if self.how == "count":
            return {self.tag: len(value)}
        if self.how == "so far":
            return {self.tag: sum(sum(v) for v in [*earlier, value])}
        if self.how in ("per client", "per class"):
            mark = "XXX" if self.how == "per client" else "CCC"
            return {self.tag.replace(mark, f"{i:03d}"): v for i, v in enumerate(value or [])}
        named = flat(value or {})
        if self.how == "mean per name":
            named = {name: mean(v) if isinstance(v, list) else v for name, v in named.items() if not isinstance(v, str)}
        return {self.tag.replace("NAME", name.replace(":", "_")): v for name, v in named.items()}


def flat(named: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a_b": 1}."""
    out = {}
    for name, value in named.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{name}_"))
        else:
            out[f"{prefix}{name}"] = value
    return out


@dataclass(frozen=True)
class Column:
    """A column of one of fedur-report's per-round tables: "privacy" (a row per round with privacy on), "answers"
    (a row per round of a run whose clients drop, lag or attack) or "server" (a row per step of an asynchronous
    server). Each table starts with the round and ends with the mean accuracy; its columns are its fields' in FIELDS
    order, and its rows the rounds that have its first field."""

    table: Literal["privacy", "answers", "server"]
    header: str
    cell: Callable[[Any], str]  # the value (None where the row lacks the field) -> its text


@dataclass(frozen=True)
class Protocol:
    """A row of fedur-report's "Evaluation protocols" table (docs/protocols.md) and a curve of its
    accuracy_protocols_<run>.png. A dict-valued field (held-out sets) gives one of each per key of the last round."""

    name: str | None  # None: the dict's key
    what: str | Callable[[str], str]  # what is tested; {covers}: "N training client(s)", {new}: the new clients' ids;
    # a dict-valued field's: of its key
    zero_shot: str | None = None  # the key of its value before any round in zero_shot.json / summary.json
    curve: str | None = None  # its curve's name in the figure (None: not drawn; "": the row's name)
    then: tuple[str, str, str] | None = None  # a row that follows: (name, what, summary.json key of its value)


Piece = Callable[[Any, dict], list[str]]  # (the field's value, the whole row) -> its words on the round line


@dataclass(frozen=True)
class Field:
    key: str  # metrics.jsonl's
    doc: str  # what it is
    when: str = ""  # when a line has it ("": always)
    tensorboard: tuple[Scalars, ...] = ()
    line: Piece | None = None  # its piece of the round line
    labelled: bool = False  # the piece is an accuracy: shown only where the data has test labels
    column: Column | None = None
    protocol: Protocol | None = None
    image: str | None = None  # a TensorBoard image the recorder draws from it
    report: str = ""  # where else fedur-report shows it

    def scalars(self, row: dict, earlier: Sequence[dict] = ()) -> dict[str, float | None]:
        """Its TensorBoard scalars in `row` (`earlier`: the run's rows before it); {} where the row lacks it."""
        if self.key not in row:
            return {}
        cumulative = any(spec.how == "so far" for spec in self.tensorboard)
        before = [r[self.key] for r in earlier if self.key in r] if cumulative else []
        return {tag: v for spec in self.tensorboard for tag, v in spec.of(row[self.key], before).items()}


def _refreshing(piece: Callable[[Any], list[str]]) -> Piece:
    """A pseudo-label piece: on the round line of a method with pseudo-labels (selected_per_class present)."""
    return lambda value, row: [] if row.get("selected_per_class") is None else piece(value)


def _if_present(words: str) -> Piece:
    return lambda value, row: [] if value is None else [words.format(fmt(value))]


def _taken(accepted: list[int], row: dict) -> list[str]:
    if len(accepted) == len(row["asked"]):
        return []
    return [f"taken {len(accepted)}/{len(row['asked'])}" + (" (global kept)" if row["kept_global"] else "")]


def _count(ids: list[int] | None) -> str:
    return str(len(ids or []))


def _estimated(value: dict | None, row: dict) -> list[str]:
    """The estimator's mean over the clients of their personal models' estimated accuracy (no labels needed)."""
    estimator = (value or {}).get("estimator")
    found = mean(((value or {}).get("personal") or {}).get(estimator) or [])
    return [] if found is None else [f"est {fmt(found)}% ({estimator})"]


def _listed(values: list | None) -> str:
    return ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values or [])


def _arrived(arrived: list[int], row: dict) -> list[str]:
    return [f"v{row['version']} arrived {','.join(map(str, arrived))} (staleness {','.join(map(str, row['staleness']))}) "
            f"at {row['virtual_clock']:.4g}s"]


def _held_out(name: str) -> str:
    if name == "novel":
        return "the server's model on the novel classes, with their names"
    return f"the server's model on the held-out {name.split(':', 1)[-1]} domain"


PRIVACY = "privacy on"
REFRESH = "a refresh"
ASKED = "every round (who answered: docs/system.md)"
ASYNCHRONOUS = "an asynchronous server's step (server.mode fedbuff | fedasync: docs/asynchronous.md)"

FIELDS: tuple[Field, ...] = (
    Field("round", "the round's number, from 1 (0 in runs of fedur from before it counted rounds from 1): "
          "TensorBoard's step", report="every table's round"),
    Field("rounds", "the rounds the run has"),
    Field("mean_accuracy", "personal accuracy: the mean over the training clients of each one's accuracy on its own "
          "test set with its own model (%)",
          tensorboard=(Scalars("accuracy/mean"),), line=lambda v, row: [] if v is None else [f"acc {fmt(v)}%"], labelled=True,
          protocol=Protocol("personal", "mean over the {covers}, each on its own test set with its own model",
                            "zero_shot_client_mean", ""),
          report="the runs table (final, best), the per-round tables' mean accuracy, accuracy_mean.png"),
    Field("client_accuracy", "every client's accuracy on its own test set (%), the new clients' too",
          tensorboard=(Scalars("accuracy/client_XXX", "per client"),),
          report="the clients table (final, best), accuracy_clients_<run>.png"),
    Field("weighted_accuracy", "the training clients' test images pooled: their accuracies weighted by test images (%)",
          tensorboard=(Scalars("accuracy/weighted_mean"),),
          protocol=Protocol("personal, weighted", "the same {covers}, weighted by their test images", "zero_shot_global")),
    Field("global_accuracy", "the server's model on the training clients' test images together (%; None without a "
          "server model)",
          tensorboard=(Scalars("accuracy/global"),), line=_if_present("global {}%"), labelled=True,
          protocol=Protocol("global", "the server's model on the {covers}' test images together", "zero_shot_global", "")),
    Field("dual_accuracy", "the harmonic mean of the personal and the global accuracy",
          tensorboard=(Scalars("accuracy/dual"),), protocol=Protocol("dual", "harmonic mean of personal and global", curve="")),
    Field("new_clients", "the ids of the clients held out of every round (evaluation.new_clients)",
          report="(new) in the clients table"),
    Field("new_client_accuracy", "the new clients' mean accuracy as they arrive: the shared pieces, no training of "
          "their own (%)",
          tensorboard=(Scalars("accuracy/new_clients"),), line=_if_present("new clients {}%"), labelled=True,
          protocol=Protocol("new clients, as they arrive", "clients {new}, held out of every round",
                            "zero_shot_new_clients", "new clients, arriving",
                            then=("new clients, adapted", "after adapting alone on their own train images",
                                  "new_client_adapted_accuracy"))),
    Field("held_out_accuracy", 'the server\'s model on test images no client holds: {"novel": %} (base-to-novel) or '
          '{"domain:NAME": %} (leave-one-domain-out); {} without',
          tensorboard=(Scalars("accuracy/held_out_NAME", "per name"),),
          line=lambda v, row: [f"{name} {fmt(value)}%" for name, value in (v or {}).items()], labelled=True,
          protocol=Protocol(None, _held_out, "zero_shot_held_out", "")),
    Field("base_novel_harmonic", "the harmonic mean of the personal (base) and the novel accuracy",
          tensorboard=(Scalars("accuracy/base_novel_harmonic"),),
          protocol=Protocol("base-novel harmonic", "harmonic mean of personal (base) and novel")),
    Field("estimated_accuracy", 'each client\'s accuracy estimated without labels (%), on its validation split '
          '(data.validation_fraction) or else its test images\' logits: {"estimator": evaluation.estimator, "personal": '
          '{estimator: [K]}, "server": {estimator: [K]} or None}; None without estimate images (no test labels, no '
          'validation split); docs/label-free.md',
          tensorboard=(Scalars("estimate/NAME", "mean per name"),), line=_estimated,
          report="the label-free tables (each estimator's error; the label-free choice)"),
    Field("server_client_accuracy", "the server's model's accuracy on each client's own test set (%), where it is "
          "free (the server's model shares the personal pass) or a validation split asks for it; else None",
          tensorboard=(Scalars("accuracy/server_client_XXX", "per client"),)),
    Field("ece", 'expected calibration error (%, 15 equal-width bins) where labels exist: {"personal": [K], "server": '
          'the server\'s model on the training clients\' test images together}; else None',
          tensorboard=(Scalars("calibration/ece_NAME", "mean per name"),),
          line=lambda v, row: [] if v is None or mean(v["personal"]) is None else [f"ece {fmt(mean(v['personal']))}"],
          labelled=True, report="the calibration table, reliability.png"),
    Field("calibration_bins", 'the reliability diagram\'s 15 bins [images, correct, confidence sum x 2^32] of the '
          'personal models (pooled over the training clients) and of the server\'s: {"personal", "server"}; None '
          'without test labels', report="reliability.png (the last round)"),
    Field("pseudo_label_accuracy", "each client's selected pseudo-labels against the held-back train labels (%): "
          "monitoring only, never used for training; None without train labels or a labeller",
          tensorboard=(Scalars("pseudo_labels/accuracy_mean", "mean"), Scalars("pseudo_labels/accuracy_client_XXX", "per client")),
          line=_refreshing(lambda v: [] if mean(v) is None else [f"pseudo-label acc {fmt(mean(v))}%"])),
    Field("selected", "each client's count of selected pseudo-labels (None without a labeller)",
          tensorboard=(Scalars("pseudo_labels/selected_total", "sum"), Scalars("pseudo_labels/selected_client_XXX", "per client")),
          line=_refreshing(lambda v: [f"selected {sum(v)}"]), report="the clients table (last round)"),
    Field("pseudo_label_agreement", "at a refresh after the first, the % of the images selected at this refresh and "
          "the previous one that kept their pseudo-label (no labels needed); else None",
          tensorboard=(Scalars("pseudo_labels/agreement_mean", "mean"),),
          line=_refreshing(lambda v: [] if mean(v or []) is None else [f"agreement {fmt(mean(v or []))}%"])),
    Field("selected_per_class", "the selected pseudo-labels per class, summed over the clients (None without a labeller)"),
    Field("selection", "(K, C) selected pseudo-labels per client and class, at a refresh (else None)",
          image="pseudo_labels/selection"),
    Field("class_weights", "the class weights of L_pos, at a refresh with class weights (else None)",
          tensorboard=(Scalars("pseudo_labels/class_weight_CCC", "per class"),)),
    Field("released_histograms", "the (K, C) rows the clients' pseudo-label histograms released: in the clear without "
          "privacy, noised under local privacy, None under central privacy", when=REFRESH),
    Field("released_totals", "the (C,) sum of the released histograms (under central privacy its noised sum, the only "
          "release)", when=REFRESH),
    Field("refreshed", "the round began with a pseudo-label refresh"),
    Field("participants", "the ids of the clients drawn to take part (federation.join_rate)"),
    Field("loss", "each client's mean loss L over the round (None: it did not train)",
          tensorboard=(Scalars("loss/loss_mean", "mean"), Scalars("loss/client_XXX", "per client")),
          line=lambda v, row: [] if row["lr"] is None else [f"loss {fmt(mean(v), 4)}"]),
    Field("lr", "the learning rate the clients trained with in the round's first local epoch (None: no client trained)",
          tensorboard=(Scalars("optim/lr"),), line=lambda v, row: [] if v is None else [f"lr {fmt(v, 4)}"]),
    Field("loss_pos", "each client's mean L_pos (None: it did not train)", tensorboard=(Scalars("loss/loss_pos_mean", "mean"),)),
    Field("loss_neg", "each client's mean L_neg (None: it did not train)", tensorboard=(Scalars("loss/loss_neg_mean", "mean"),)),
    Field("phase_seconds", "wall seconds of the round's phases: refresh, train, aggregate, evaluate",
          tensorboard=(Scalars("time/NAME_seconds", "per name"),)),
    Field("bytes_sent", "the bytes each client uploaded: one of each shared piece and message, and at a refresh its "
          "class counts",
          tensorboard=(Scalars("comm/bytes_total", "sum"), Scalars("comm/bytes_cumulative", "so far"))),
    Field("upload_bytes", "{shared piece or message: bytes} of one client's upload",
          tensorboard=(Scalars("comm/upload_bytes_NAME", "per name"),)),
    Field("prompt_divergence", "{piece: {drift_diversity, cosine_distance}} of the clients' local updates (the "
          "paper's Fig. 2)", tensorboard=(Scalars("divergence/NAME", "per name"),)),
    Field("method", "the method's own metrics of the round ({name: number}: Aggregated.metrics)",
          tensorboard=(Scalars("method/NAME", "per name"),), report="the method metrics table (first, last, min, max)"),
    Field("asked", "the ids of the clients drawn and uploading (privacy on: every drawn client)", when=ASKED,
          tensorboard=(Scalars("clients/asked", "count"),), column=Column("answers", "asked", _count)),
    Field("answered", "whose upload arrived, in time or late", when=ASKED,
          tensorboard=(Scalars("clients/answered", "count"),), column=Column("answers", "answered", _count)),
    Field("dropped", "who trained and sent, and whose upload was lost (clock.drop_rate)", when=ASKED,
          tensorboard=(Scalars("clients/dropped", "count"),), column=Column("answers", "lost", _count)),
    Field("late", "who was past the deadline: left out, or cut short (clock.late partial)", when=ASKED,
          tensorboard=(Scalars("clients/late", "count"),), column=Column("answers", "late", _count)),
    Field("surplus", "whose upload arrived after the first wanted ones (clock.over_select): not taken", when=ASKED,
          tensorboard=(Scalars("clients/surplus", "count"),)),
    Field("accepted", "whose upload the server aggregated (unless kept_global)", when=ASKED,
          tensorboard=(Scalars("clients/accepted", "count"),), line=_taken, column=Column("answers", "taken", _count)),
    Field("histograms_lost", "whose pseudo-label histograms were lost at this round's refresh (clock.drop_rate)",
          when=ASKED),
    Field("attackers_accepted", "the attackers among the accepted (adversary.attackers)", when=ASKED),
    Field("kept_global", "fewer uploads than clock.min_uploads: nothing aggregated, the global state stayed",
          when=ASKED, column=Column("answers", "global", lambda kept: "kept" if kept else "")),
    Field("virtual_seconds", "the round's virtual duration", when=ASKED, tensorboard=(Scalars("time/virtual_seconds"),),
          column=Column("answers", "virtual s", lambda v: f"{v or 0:.4g}")),
    Field("virtual_clock", "the run's virtual seconds after this round (an asynchronous step: the time of its last "
          "arrival)", when=f"{ASKED}; {ASYNCHRONOUS}",
          tensorboard=(Scalars("time/virtual_clock"),), column=Column("answers", "virtual clock", lambda v: f"{v or 0:.4g}"),
          report="accuracy_virtual_time.png"),
    Field("deadline_seconds", "the round's deadline in virtual seconds (None: no deadline)", when=ASKED),
    Field("client_virtual_seconds", "each asked client's virtual seconds to answer (None: not asked)", when=ASKED),
    Field("local_steps", "each asked client's budget of local steps (None: not asked)", when=ASKED),
    Field("version", "the global version after the step: the server's steps so far", when=ASYNCHRONOUS,
          tensorboard=(Scalars("server/version"),), column=Column("server", "version", str)),
    Field("arrived", "the clients whose updates the step applied, in the order they arrived", when=ASYNCHRONOUS,
          line=_arrived, column=Column("server", "arrived", _listed)),
    Field("staleness", "each arrival's staleness (in the order of `arrived`): how many versions the one it trained from "
          "was behind the one it was applied to", when=ASYNCHRONOUS,
          tensorboard=(Scalars("server/staleness_mean", "mean"), Scalars("server/staleness_max", "max")),
          column=Column("server", "staleness", _listed)),
    Field("step_sizes", "each arrival's factor on its change: server.server_lr x s(staleness) (FedBuff) or server.mixing "
          "x s(staleness) (FedAsync)", when=ASYNCHRONOUS, tensorboard=(Scalars("server/step_size_mean", "mean"),),
          column=Column("server", "step sizes", _listed)),
    Field("arrival_seconds", "each arrival's virtual time", when=ASYNCHRONOUS,
          column=Column("server", "arrived at (virtual s)", _listed)),
    Field("arrival_steps", "each arrival's local steps (its epochs over the pseudo-labels it selected as it started)",
          when=ASYNCHRONOUS),
    Field("started", "the clients that start from the new version (those the step applied, or idle ones drawn), "
          "ascending", when=ASYNCHRONOUS, column=Column("server", "started", _listed)),
    Field("in_flight", "the clients training after the step, ascending", when=ASYNCHRONOUS,
          tensorboard=(Scalars("server/in_flight", "count"),)),
    Field("epsilon", "the epsilon spent so far at `delta` (None: infinite)", when=PRIVACY,
          tensorboard=(Scalars("privacy/epsilon"),), line=lambda v, row: ["eps inf" if v is None else f"eps {v:.2f}"],
          column=Column("privacy", "epsilon", lambda v: "inf" if v is None else f"{v:.3f}")),
    Field("delta", "privacy.delta", when=PRIVACY, report="the privacy table's caption"),
    Field("clip", "the clipping norm of the round's updates (adaptive clipping: this round's)", when=PRIVACY,
          tensorboard=(Scalars("privacy/clip"),), column=Column("privacy", "clip", lambda v: f"{v or 0:.4g}")),
    Field("epsilon_per_client", "each client's epsilon spent so far (None: infinite)", when="local privacy"),
    Field("round_seconds", "the round's wall seconds", tensorboard=(Scalars("time/round_seconds"),),
          line=lambda v, row: [f"{v:.1f}s"], report="the runs table's wall time of a run still going"),
)

FIELD = {field.key: field for field in FIELDS}

# The TensorBoard entries that are not a round's fields: the zero-shot step 0 logs mean_accuracy's, client_accuracy's
# and held_out_accuracy's tags.
ADAPTED = "accuracy/new_clients_adapted"  # step R + 1: summary.json's new_client_adapted_accuracy
HPARAMS = ("final_mean_accuracy", "best_mean_accuracy", "zero_shot_client_mean")  # hparams/<key>: summary.json's, step R
PARTITION = "partition/NAME"  # images of the split: train and test, step 0
CONFUSION = "confusion/final"  # image: the final model's confusion matrix, step R
VIRTUAL_TIME = "accuracy/virtual_time"  # image: accuracy against the virtual clock, step R
RELIABILITY = "calibration/reliability"  # image: the last round's reliability diagram, step R
CONFIG = "config"  # text: the resolved settings, step 0
OTHER_TAGS = (ADAPTED, *(f"hparams/{key}" for key in HPARAMS), PARTITION, CONFUSION, VIRTUAL_TIME, RELIABILITY, CONFIG)


def scalars(row: dict, earlier: Sequence[dict] = ()) -> dict[str, float | None]:
    """Every TensorBoard scalar of a row (or of the fields a partial row has), in FIELDS order."""
    return {tag: value for field in FIELDS for tag, value in field.scalars(row, earlier).items()}


def round_line(row: dict, test_labels: bool = True) -> list[str]:
    """The row's pieces of the round line, in FIELDS order (the accuracies only with `test_labels`)."""
    return [word for field in FIELDS if field.line is not None and field.key in row and (test_labels or not field.labelled)
            for word in field.line(row[field.key], row)]


def undeclared(row: dict) -> list[str]:
    return [key for key in row if key not in FIELD]


def markdown() -> str:
    """docs/outputs.md's table of the fields."""
    lines = ["| key | when | what | TensorBoard | fedur-report |", "| --- | --- | --- | --- | --- |"]
    for f in FIELDS:
        tags = [f"`{s.tag}`" + ("" if s.how == "value" else f" ({s.how})") for s in f.tensorboard]
        tags += [f"`{f.image}` (image)"] if f.image else []
        shown = [f"{f.column.table} table: {f.column.header}"] if f.column else []
        shown += [f"protocols table: {f.protocol.name or 'one row per key'}"] if f.protocol else []
        shown += [f.report] if f.report else []
        lines.append(f"| `{f.key}` | {f.when or 'always'} | {f.doc} | {', '.join(tags)} | {'; '.join(shown)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
