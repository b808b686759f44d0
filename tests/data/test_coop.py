"""CoOp's suite and ImageNet's shifted test sets: tiny copies of each layout (split files included) load with CoOp's
class names, templates and splits; the registry finds them; a missing copy is downloaded through torchvision into
CoOp's layout when allowed, or refused in one line naming what to fetch and where from."""

import json
from pathlib import Path

import numpy as np
import pytest

import fedur.data.downloads as downloads
from fedur.data import coop
from fedur.data.benchmarks import DTD
from fedur.data.coop import COOP_DATASETS_MD, SUN397, Caltech101, EuroSAT, FGVCAircraft, Food101, OxfordFlowers, OxfordPets, StanfordCars
from fedur.data.datasets import DataOptions, DataUnavailableError, dataset_classes, prepare_dataset
from fedur.data.imagenet import ImageNet, ImageNetA, ImageNetR, ImageNetSketch, ImageNetV2
from fedur.data.inspect import dataset_report
from tests.data.coop_layouts import IMAGENET, PARTS, write_fgvc, write_imagenet, write_shifted, write_split_dataset

SPLIT_DATASETS = [Caltech101, OxfordPets, StanfordCars, OxfordFlowers, Food101, SUN397, EuroSAT]
# (class names after CoOp's cleaning, CoOp's template: trainers/zsclip.py CUSTOM_TEMPLATES)
EXPECTED = {
    "caltech101": (["airplane", "face", "accordion"], "a photo of a {}."),
    "oxford_pets": (["abyssinian", "american bulldog"], "a photo of a {}, a type of pet."),
    "stanford_cars": (["2000 AM General Hummer SUV", "2012 Acura RL Sedan"], "a photo of a {}."),
    "oxford_flowers": (["pink primrose", "hard-leaved pocket orchid"], "a photo of a {}, a type of flower."),
    "food101": (["apple pie", "baby back ribs"], "a photo of {}, a type of food."),
    "sun397": (["abbey", "outdoor apartment building"], "a photo of a {}."),
    "eurosat": (["Annual Crop Land", "Sea or Lake"], "a centered satellite photo of {}."),
}


def build(source, **options):
    return prepare_dataset(source, DataOptions(**options), seed=1)


@pytest.mark.parametrize("cls", SPLIT_DATASETS, ids=lambda c: c.__name__)
def test_split_file_layouts(tmp_path, cls):
    root = write_split_dataset(tmp_path / cls.key, cls)
    cls(str(root), download=False).check()
    ds = build(cls(str(root), download=False))
    names, template = EXPECTED[cls.key]
    assert ds.name == cls.key and ds.classnames == names and ds.template == template
    n = len(names)
    assert np.bincount(ds.train.labels, minlength=n).tolist() == [PARTS["train"]] * n  # "train" only
    assert np.bincount(ds.test.labels, minlength=n).tolist() == [PARTS["test"]] * n
    with_val = build(cls(str(root), include_val=True, download=False))
    assert np.bincount(with_val.train.labels).tolist() == [PARTS["train"] + PARTS["val"]] * n
    split = json.loads((root / cls.layout.split_file).read_text())
    first = root / cls.layout.images / split["train"][0][0]
    assert ds.train.paths[0] == str(first) and ds.train.load(0).size == (8, 8)
    assert dataset_classes()[cls.key] is cls
    assert f"{n * PARTS['train']:,} train / {n * PARTS['test']:,} test" in dataset_report(ds)


def test_fgvc_aircraft_reads_its_own_lists(tmp_path):
    root = write_fgvc(tmp_path)
    ds = build(FGVCAircraft(str(root), download=False))
    assert ds.classnames == ["707-320", "A300B4", "Cessna 172"] and ds.template == "a photo of a {}, a type of aircraft."
    assert np.bincount(ds.train.labels).tolist() == [3, 3, 3] and np.bincount(ds.test.labels).tolist() == [2, 2, 2]
    assert ds.test.paths[-1] == str(root / "images" / "21te.jpg")  # label 2, image 1 of "test"
    (root / "images_variant_test.txt").write_text("00te Boeing 999\n")
    with pytest.raises(DataUnavailableError, match=r"images_variant_test.txt:1: variant 'Boeing 999' is not in"):
        build(FGVCAircraft(str(root), download=False))


def test_dtd_in_coop_layout_beside_elevater(tmp_path):
    root = write_split_dataset(tmp_path, "dtd")
    ds = build(DTD(str(root)))
    assert ds.classnames == ["banded", "zigzagged"] and ds.template == "a photo of a {}"  # FedCoPL's, as ELEVATER's
    assert np.bincount(ds.train.labels).tolist() == [3, 3] and np.bincount(ds.test.labels).tolist() == [2, 2]
    assert ds.train.paths[0] == str(root / "images" / "banded" / "0_train0.jpg")
    assert np.bincount(build(DTD(str(root), include_val=True)).train.labels).tolist() == [4, 4]


def test_imagenet_layout(tmp_path):
    root = write_imagenet(tmp_path)
    ds = build(ImageNet(str(root)))
    assert ds.classnames == [name for _, name in IMAGENET] and ds.template == "a photo of a {}."
    assert np.bincount(ds.train.labels).tolist() == [3] * 4 and np.bincount(ds.test.labels).tolist() == [2] * 4
    assert ds.test.paths[0] == str(root / "images" / "val" / "n01440764" / "n01440764_val0.JPEG")
    assert not ImageNet.test_only


@pytest.mark.parametrize("cls", [ImageNetV2, ImageNetSketch, ImageNetA, ImageNetR], ids=lambda c: c.__name__)
def test_shifted_test_sets(tmp_path, cls):
    root = write_shifted(tmp_path, cls.key)
    ds = build(cls(str(root)))
    assert cls.test_only and len(ds.train) == 0 and ds.template == "a photo of a {}."
    if cls in (ImageNetA, ImageNetR):  # a class subset: its own classes, sorted by wnid, with ImageNet's names
        assert ds.classnames == ["goldfish", "tiger shark"] and ds.test.labels.tolist() == [0, 0, 1, 1]
        mapped = build(cls(str(root), classes="imagenet"))  # onto ImageNet's 1,000 (here 4) classes and labels
        assert mapped.classnames == [name for _, name in IMAGENET] and mapped.test.labels.tolist() == [1, 1, 3, 3]
    else:
        assert ds.classnames == [name for _, name in IMAGENET] and np.bincount(ds.test.labels).tolist() == [2] * 4
    assert "0 train / " in dataset_report(ds)


def test_class_folder_not_in_classnames_is_named(tmp_path):
    root = write_shifted(tmp_path, "imagenet_a")
    (root / "imagenet-a" / "n99999999").mkdir()
    (root / "imagenet-a" / "n99999999" / "x.jpg").write_bytes((root / "imagenet-a" / "n01443537" / "0.jpg").read_bytes())
    with pytest.raises(DataUnavailableError, match="class folder.*n99999999 are not wnids of classnames.txt"):
        build(ImageNetA(str(root)))


def test_missing_imagenet_says_where_from(tmp_path):
    with pytest.raises(DataUnavailableError) as err:
        ImageNetR(str(tmp_path)).check()
    line = err.value.one_line()
    assert "\n" not in line and "cannot be downloaded through torchvision" in line
    assert "https://github.com/hendrycks/imagenet-r" in line


def test_missing_copy_offline_names_what_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setattr(downloads, "reachable", lambda host: False)
    with pytest.raises(DataUnavailableError) as err:
        Food101(str(tmp_path)).check()
    line = err.value.one_line()
    assert "data.vision.ee.ethz.ch is unreachable (offline?)" in line and COOP_DATASETS_MD in line
    assert "https://drive.google.com/file/d/1QK0tGi096I0Ba6kggatX1ee6dJFIcEJl/view" in line  # split_zhou_Food101.json
    with pytest.raises(DataUnavailableError, match="dataset.download is false"):
        Food101(str(tmp_path), download=False).check()
    with pytest.raises(DataUnavailableError, match="cannot be downloaded \\(torchvision does not have them\\)"):
        StanfordCars(str(tmp_path)).check()


def test_split_file_alone_missing_needs_only_the_drive(tmp_path, monkeypatch):
    root = write_split_dataset(tmp_path, EuroSAT)
    (root / EuroSAT.layout.split_file).unlink()
    monkeypatch.setattr(downloads, "reachable", lambda host: True)
    monkeypatch.setattr(downloads, "gdown_installed", lambda: False)
    with pytest.raises(DataUnavailableError, match=r"split_zhou_EuroSAT.json missing .*needs gdown \(pip install gdown\)"):
        EuroSAT(str(root)).check()


def test_download_goes_through_torchvision_into_coops_layout(tmp_path, monkeypatch):
    """torchvision's Food101 and Drive download, stood in for by writers of what they leave on disk: the loader
    then finds CoOp's layout, the staging folder is gone."""
    import torchvision.datasets
    import torchvision.datasets.utils

    made = write_split_dataset(tmp_path / "made", Food101)
    calls = []

    class FakeFood101:
        def __init__(self, root, download):
            calls.append(("Food101", root, download))
            target = Path(root) / "food-101"
            target.mkdir(parents=True)
            (made / "images").rename(target / "images")
            (target / "meta").mkdir()

    def fake_drive(file_id, root, filename):
        calls.append(("drive", file_id, filename))
        (made / filename).rename(Path(root) / filename)

    monkeypatch.setattr(torchvision.datasets, "Food101", FakeFood101)
    monkeypatch.setattr(torchvision.datasets.utils, "download_file_from_google_drive", fake_drive)
    monkeypatch.setattr(downloads, "reachable", lambda host: True)
    monkeypatch.setattr(downloads, "gdown_installed", lambda: True)
    root = tmp_path / "food-101"
    ds = build(Food101(str(root)))
    assert [c[0] for c in calls] == ["Food101", "drive"] and calls[1][1] == Food101.layout.split_id
    assert calls[0][1] == str(root / downloads.STAGING) and calls[0][2] is True
    assert sorted(p.name for p in root.iterdir()) == ["images", "meta", "split_zhou_Food101.json"]
    assert ds.classnames == ["apple pie", "baby back ribs"] and len(ds.test) == 4


def test_every_coop_layout_moves_what_its_loader_reads():
    """Each torchvision source's moves land on the layout's folders (or, for FGVCAircraft, the whole data/ folder)."""
    for cls in [*SPLIT_DATASETS, FGVCAircraft]:
        layout = cls.layout
        if layout.source is None:
            assert cls is StanfordCars and "kaggle" in layout.by_hand
            continue
        targets = {dst for _, dst in layout.source.moves}
        assert targets == {"."} or set(layout.folders) <= targets, cls.__name__
    assert {dst for _, dst in coop.DTD_COOP.source.moves} >= set(coop.DTD_COOP.folders)


MAIN_CONFIG = {cls.key: cls for cls in [*SPLIT_DATASETS, FGVCAircraft, ImageNet]}


@pytest.mark.parametrize("key", sorted(MAIN_CONFIG))
def test_main_config_checks_a_tiny_copy(tmp_path, run_main, key):
    """`fedur --config configs/<key>.yaml --dataset.root COPY --check_data` prints the copy's counts."""
    cls = MAIN_CONFIG[key]
    root = write_fgvc(tmp_path) if cls is FGVCAircraft else write_imagenet(tmp_path) if cls is ImageNet \
        else write_split_dataset(tmp_path, cls)
    download = [] if cls is ImageNet else ["--dataset.download", "false"]  # ImageNet has nothing to download
    result = run_main("--config", f"configs/{key}.yaml", "--dataset.root", str(root), *download, "--check_data")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{key}: ") and " train / " in result.stdout


def test_a_test_only_set_checks_but_does_not_train(tmp_path, run_main):
    root = write_shifted(tmp_path / "a", "imagenet_a")
    checked = run_main("--config", "configs/tiny.yaml", "--dataset", "ImageNetA", "--dataset.root", str(root), "--check_data")
    assert checked.returncode == 0 and "imagenet_a: 2 classes, 0 train / 4 test images" in checked.stdout
    refused = run_main("--config", "configs/tiny.yaml", "--dataset", "ImageNetA", "--dataset.root", str(root),
                       "--run.output_dir", str(tmp_path / "run"))
    assert refused.returncode == 2 and "ImageNetA is a test set only" in refused.stderr
    assert "fedur-cross-dataset RUN --dataset ImageNetA" in refused.stderr and not (tmp_path / "run").exists()
