"""fedur-export and fedur-predict: a trained client's model as one file, loaded back as an nn.Module from images to
logits whose predictions on the run's test images are the run's own, bitwise on the CPU, for every method (or a
one-line refusal); and fedur-predict's CSV of image files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedur.app.attack import rebuild
from fedur.app.export import exported
from fedur.app.export import main as export_main
from fedur.app.predict import main as predict_main
from fedur.data.loaders import in_batches
from fedur.methods.export import ExportError, from_export, load_exported

from .shared_runs import LABEL_FREE, method_cases, runs_rounds

pytestmark = pytest.mark.slow  # the session's shared runs, rebuilt

CASES = {name: flags for name, flags in method_cases().items() if "+" not in name}  # every one of fedur's methods


def batches_of(host, client):
    """The client's test images as the run's evaluation passes them: its batches of the image cache (uint8)."""
    yield from host.images.batches("test", in_batches(client.test_indices, host.work.eval_batch_size))


def logits_of(model, host, client) -> torch.Tensor:
    """An exported model's logits of the client's test batches, normalised as its preprocess would (the cache's
    normalisation gives preprocess's tensors bit for bit: fedur/data/cache.py)."""
    return torch.cat([model(host.model.normalize(images)).float() for images in batches_of(host, client)])


@pytest.mark.parametrize("name", list(CASES))
def test_every_method_exports_a_model_whose_predictions_are_the_runs_bitwise(tiny_runs, name):
    """The personal and the server's model of client 1 (zero-shot CLIP, the same for every method, once: FedUR's run),
    on its test images as the run passes them; a model a method cannot export is refused in one line."""
    run = tiny_runs / name
    rebuilt = rebuild(run, "cpu")
    host, client = rebuilt.host, rebuilt.host.clients[1]
    kinds = (["personal", "server"] if runs_rounds(CASES[name]) else []) + (["zero-shot"] if name in ("fedur", "zeroshot") else [])
    for kind in kinds:
        try:
            model = from_export(exported(run, 1, kind), "cpu")
        except ExportError as err:  # a method that cannot export this model says why, in one line
            assert kind == "server" and rebuilt.server is None and "\n" not in str(err), (kind, str(err))
            continue
        got = logits_of(model, host, client)
        with torch.no_grad():
            if kind == "personal":
                want = host.predict("test", clients=[client])[1][0]
            elif kind == "zero-shot":
                want = host.predict("test", zero_shot=True, clients=[client])[1][0]
            else:
                server = rebuilt.server
                want = torch.cat([host.method.logits(host.model, images, server.client.pieces, server.text, server.client,
                                                     None).float() for images in batches_of(host, client)])
        assert torch.equal(got, want), (name, kind)
        if kind == "personal":  # its predictions give the run's accuracy
            labels = torch.from_numpy(host.dataset.test.labels[client.test_indices])
            accuracy = 100.0 * float((got.argmax(-1) == labels).sum()) / len(labels)
            assert accuracy == json.loads((run / "summary.json").read_text())["final_client_accuracy"][1]


@pytest.mark.parametrize("name", list(LABEL_FREE))
def test_the_chosen_model_exports_as_the_candidate_it_is(tiny_runs, name, tmp_path):
    run = tiny_runs / name
    choice = json.loads((run / "summary.json").read_text())["label_free_choice"]["clients"]
    rebuilt = rebuild(run, "cpu")
    for k in range(4):
        assert export_main([str(run), "--client", str(k), str(tmp_path / f"chosen_{k}.pt"), "--model", "chosen"]) == 0
        chosen = load_exported(tmp_path / f"chosen_{k}.pt")
        assert (chosen.kind, chosen.round) == (choice[k]["model"], choice[k]["round"])
        labels = torch.from_numpy(rebuilt.host.dataset.test.labels[rebuilt.host.clients[k].test_indices])
        correct = (logits_of(chosen, rebuilt.host, rebuilt.host.clients[k]).argmax(-1) == labels).sum()
        assert 100.0 * float(correct) / len(labels) == choice[k]["accuracy"]  # the choice's recorded true accuracy


def test_fedur_predict_labels_image_files_as_the_exported_model_does(tiny_runs, tmp_path, capsys):
    """A round trip: some of the run's test images written as PNG files, labelled by fedur-predict (CSV), by the file
    fedur-export wrote, and by the run itself: the same classes. An unreadable file stops it, or is skipped."""
    run = tiny_runs / "fedur"
    rebuilt = rebuild(run, "cpu")
    client = rebuilt.host.clients[2]
    rows = client.test_indices[:6]
    folder = tmp_path / "images"
    folder.mkdir()
    arrays = rebuilt.host.dataset.test.arrays
    for i, row in enumerate(rows):
        Image.fromarray(np.asarray(arrays[row], dtype=np.uint8)).save(folder / f"image_{i}.png")
    out = tmp_path / "labels.csv"
    assert predict_main([str(run), str(folder), "--client", "2", "--out", str(out), "--batch-size", "4",
                         "--no-progress"]) == 0
    with open(out, newline="") as f:
        lines = list(csv.DictReader(f))
    assert [Path(line["image"]).name for line in lines] == [f"image_{i}.png" for i in range(6)]
    assert export_main([str(run), "--client", "2", str(tmp_path / "client_2.pt")]) == 0
    model = load_exported(tmp_path / "client_2.pt")
    with Image.open(folder / "image_0.png") as image:
        first = model(model.preprocess(image.convert("RGB"))[None])
    assert int(first.argmax()) == int(lines[0]["class"]) and lines[0]["name"] == model.classnames[int(lines[0]["class"])]
    with torch.no_grad():
        theirs = rebuilt.host.predict("test", clients=[client])[2][0][:6].argmax(-1).tolist()
    assert [int(line["class"]) for line in lines] == theirs  # the run's own predictions
    assert all(0 < float(line["confidence"]) <= 1 for line in lines)

    (folder / "broken.png").write_bytes(b"not an image")
    capsys.readouterr()
    assert predict_main([str(run), str(folder), "--client", "2", "--no-progress", "--corrupt-images", "stop"]) == 2
    assert "broken.png: cannot be read as an image" in capsys.readouterr().err
    assert predict_main([str(run), str(folder), "--client", "2", "--no-progress", "--corrupt-images", "skip",
                         "--out", str(out)]) == 0
    assert "1 unreadable image(s) left out" in capsys.readouterr().err


def test_export_refusals_are_one_line(tiny_runs, tmp_path, capsys):
    run = tiny_runs / "fedur"
    for args, message in ((["--client", "9"], "the run has clients 0 .. 3"),
                          (["--client", "0", "--round", "7"], "keeps the checkpoints of round(s) [1, 2] only"),
                          (["--client", "0", "--model", "chosen"], "kept no label-free choice")):
        assert export_main([str(run), *args, str(tmp_path / "x.pt")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    with pytest.raises(ExportError, match="is not a fedur export"):
        torch.save({"something": 1}, tmp_path / "other.pt")
        load_exported(tmp_path / "other.pt")
