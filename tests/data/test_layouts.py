"""Tiny on-disk copies of every dataset layout, written here, load with the right counts, names, templates
and domains; broken copies fail with errors that name the path, what was expected and what was found."""

import io
import json
import pickle

import numpy as np
import pytest
from jsonargparse import ArgumentError, ArgumentParser
from PIL import Image

from fedur.data.benchmarks import CUB, DTD, RESISC45, UCF101
from fedur.data.cifar import CIFAR, CIFAR10, CIFAR100
from fedur.data.datasets import DataOptions, Dataset, DataUnavailableError, prepare_dataset
from fedur.data.domains import DOMAINNET_DOMAINS, DOMAINNET_FEDBN_CLASSES, DomainNet, OfficeHome, stratified_holdout
from fedur.data.inspect import dataset_report

_buffer = io.BytesIO()
Image.fromarray(np.full((8, 8, 3), 90, dtype=np.uint8)).save(_buffer, format="PNG")
PNG = _buffer.getvalue()  # one encoded 8x8 image, written under every name (fast)


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(PNG)


def lines(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{row}\n" for row in rows))


def build(source, seed=1, **options):
    """Load and prepare as a run does: the dataset's own options on `source`, the `data:` ones here."""
    return prepare_dataset(source, DataOptions(**options), seed)


def counts(split, num_classes):
    return np.bincount(split.labels, minlength=num_classes).tolist()


# ---------------------------------------------------------------- layouts


def write_dtd(root, names=("banded", "polka-dotted", "zig_zag"), per_split=None):
    per_split = per_split or {"train": 2, "val": 1, "test": 1}
    lines(root / "class_names.txt", names)
    for split, n in per_split.items():
        rows = []
        for label, name in enumerate(names):
            for i in range(n):
                relative = f"{name}/{name}_{split}{i}.jpg"
                touch(root / split / relative)
                rows.append(f"{split}.zip@{relative} {label}" if i == 0 else f"{relative} {label}")
        lines(root / f"{split}.txt", rows)
    return root


def write_resisc45(root):
    folders = ["airplane", "baseball_diamond"]
    for split, n in (("train", 2), ("val", 1), ("test", 3)):
        images = []
        for folder in folders:
            for i in range(n):
                name = f"{folder}_{split}{i:03d}.jpg"
                touch(root / folder / name)
                images.append({"id": len(images) + 1, "file_name": f"{split}_images.zip@{folder}/{name}"})
        categories = [{"id": i + 1, "name": f} for i, f in enumerate(folders)]
        (root / f"{split}.json").write_text(json.dumps({"images": images, "categories": categories}))
    return root


def write_cub(root):
    base = root / "CUB_200_2011"
    classes = ["001.Black_footed_Albatross", "002.Laysan_Albatross"]
    lines(base / "classes.txt", [f"{i + 1} {c}" for i, c in enumerate(classes)])
    images, labels, split = [], [], []
    for c, folder in enumerate(classes):
        for i, is_train in enumerate([1, 1, 1, 0, 0]):
            image_id = len(images) + 1
            relative = f"{folder}/{folder[4:]}_{i}.jpg"
            touch(base / "images" / relative)
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {c + 1}")
            split.append(f"{image_id} {is_train}")
    lines(base / "images.txt", images)
    lines(base / "image_class_labels.txt", labels)
    lines(base / "train_test_split.txt", split)
    return root


UCF_CLASSES = ["Apply_Eye_Makeup", "Archery"]


def write_ucf101_fedcopl(root):
    lines(root / "class_names.txt", UCF_CLASSES)
    for split, n in (("train", 3), ("test", 1)):
        rows = []
        for label, folder in enumerate(UCF_CLASSES):
            for i in range(n):
                name = f"v_{folder}_g0{i}_c01.jpg"
                touch(root / split / folder / name)
                rows.append(f"/original/ucf/{split}/{folder}/{name} {label}")
        lines(root / f"{split}.txt", rows)
    return root


def write_ucf101_coop(root):
    split = {"train": [], "val": [], "test": []}
    for part, n in (("train", 3), ("val", 1), ("test", 2)):
        for label, folder in enumerate(UCF_CLASSES):
            for i in range(n):
                relative = f"{folder}/v_{folder}_{part}{i}.jpg"
                touch(root / "UCF-101-midframes" / relative)
                split[part].append([relative, label, folder])
    (root / "split_zhou_UCF101.json").write_text(json.dumps(split))
    return root


def write_cifar(root, name):
    """torchvision's python-pickle layout with 2 images per class and split; pixel (r, g, b) = (label, 7, 9)."""
    classes = 10 if name == "cifar10" else 100
    folder, label_key, meta, names_key = {
        "cifar10": ("cifar-10-batches-py", "labels", "batches.meta", "label_names"),
        "cifar100": ("cifar-100-python", "fine_labels", "meta", "fine_label_names"),
    }[name]
    files = {"train": [f"data_batch_{i}" for i in range(1, 6)] if name == "cifar10" else ["train"]}
    files["test"] = ["test_batch"] if name == "cifar10" else ["test"]
    (root / folder).mkdir(parents=True)
    for names in files.values():
        labels = np.repeat(np.arange(classes), 2)
        planes = np.stack([labels, np.full_like(labels, 7), np.full_like(labels, 9)], axis=1)  # (N, 3)
        data = np.repeat(planes, 1024, axis=1).astype(np.uint8)  # (N, 3072): R plane, G plane, B plane
        for i, part in enumerate(np.array_split(np.arange(len(labels)), len(names))):
            with open(root / folder / names[i], "wb") as f:
                pickle.dump({"data": data[part], label_key: labels[part].tolist()}, f)
    with open(root / folder / meta, "wb") as f:
        pickle.dump({names_key: [f"class_{c}" for c in range(classes)]}, f)
    return root


FAKE_DOMAINNET = {"aircraft_carrier": 0, **{c: 20 + 10 * i for i, c in enumerate(DOMAINNET_FEDBN_CLASSES)}, "zebra": 5}


def write_domainnet(root, domains=DOMAINNET_DOMAINS, classes=None):
    """Official "<domain>/<class>/<file> <label>" lists; 2 train and 1 test image per domain and class.
    'zebra' gets official label 5, so the official order differs from the alphabetical one."""
    classes = classes or FAKE_DOMAINNET
    for domain in domains:
        for split, n in (("train", 2), ("test", 1)):
            rows = []
            for folder, label in classes.items():
                for i in range(n):
                    relative = f"{domain}/{folder}/{domain}_{split}_{i}.jpg"
                    touch(root / relative)
                    rows.append(f"{relative} {label}")
            lines(root / f"{domain}_{split}.txt", rows)
    return root


OFFICE_CLASSES = [f"Class_{i:02d}" for i in range(65)]


def write_officehome(root, per_class=3):
    for domain in ("Art", "Clipart", "Product", "Real World"):  # the official archive's spelling
        for folder in OFFICE_CLASSES:
            for i in range(per_class):
                touch(root / domain / folder / f"{i:05d}.jpg")
    return root


# ---------------------------------------------------------------- loading


def test_dtd(tmp_path):
    DTD(str(write_dtd(tmp_path))).check()
    ds = build(DTD(str(tmp_path)))
    assert ds.classnames == ["banded", "polka-dotted", "zig zag"] and ds.template == "a photo of a {}"
    assert counts(ds.train, 3) == [3, 3, 3] and counts(ds.test, 3) == [1, 1, 1]  # train = train.txt + val.txt
    assert ds.train.paths[0] == str(tmp_path / "train/banded/banded_train0.jpg")  # zip prefix dropped
    assert ds.train.domains is None and ds.domain_names is None
    assert ds.train.load(0).size == (8, 8)


def test_resisc45(tmp_path):
    ds = build(RESISC45(str(write_resisc45(tmp_path))))
    assert ds.classnames == ["airplane", "baseball diamond"] and ds.template == "a photo of a {}"
    assert counts(ds.train, 2) == [3, 3] and counts(ds.test, 2) == [3, 3]
    assert ds.test.paths[-1] == str(tmp_path / "baseball_diamond/baseball_diamond_test002.jpg")


def test_cub(tmp_path):
    ds = build(CUB(str(write_cub(tmp_path))))
    assert ds.classnames == ["black footed albatross", "laysan albatross"] and ds.template == "a photo of a {}"
    assert counts(ds.train, 2) == [3, 3] and counts(ds.test, 2) == [2, 2]


def test_ucf101_both_layouts(tmp_path):
    ds = build(UCF101(str(write_ucf101_fedcopl(tmp_path / "fedcopl"))))
    assert ds.classnames == ["Apply Eye Makeup", "Archery"] and ds.template == "a photo of a {}"
    assert counts(ds.train, 2) == [3, 3] and counts(ds.test, 2) == [1, 1]
    assert ds.train.paths[0].endswith("fedcopl/train/Apply_Eye_Makeup/v_Apply_Eye_Makeup_g00_c01.jpg")
    coop = write_ucf101_coop(tmp_path / "coop")
    ds = build(UCF101(str(coop)))
    assert ds.classnames == ["Apply Eye Makeup", "Archery"]
    assert counts(ds.train, 2) == [3, 3] and counts(ds.test, 2) == [2, 2]
    assert counts(build(UCF101(str(coop), include_val=True)).train, 2) == [4, 4]


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_pickles(tmp_path, name):
    classes = 10 if name == "cifar10" else 100
    ds = build({"cifar10": CIFAR10, "cifar100": CIFAR100}[name](str(write_cifar(tmp_path, name)), download=False))
    assert ds.classnames[:2] == ["class 0", "class 1"] and ds.template == "a photo of a {}."
    assert counts(ds.train, classes) == [2] * classes and ds.train.arrays.shape == (2 * classes, 32, 32, 3)
    assert ds.test.arrays[5, 3, 4].tolist() == [ds.test.labels[5], 7, 9]  # channel planes -> HWC


def test_domainnet_fedbn_subset_in_official_order(tmp_path):
    ds = build(DomainNet(str(write_domainnet(tmp_path))))
    assert ds.classnames == ["zebra"] + [c.replace("_", " ") for c in DOMAINNET_FEDBN_CLASSES[:-1]]
    assert ds.template == "a photo of a {}." and ds.domain_names == DOMAINNET_DOMAINS
    assert len(ds.train) == 6 * 10 * 2 and len(ds.test) == 6 * 10  # aircraft_carrier is not in the subset
    assert np.bincount(ds.train.domains).tolist() == [20] * 6 and ds.train.domains.dtype == np.int64
    picked = build(DomainNet(str(tmp_path), domains=["Sketch", "clipart"]))
    assert picked.domain_names == ["sketch", "clipart"] and picked.classnames == ds.classnames
    assert all("/sketch/" in p for p, d in zip(picked.test.paths, picked.test.domains) if d == 0)
    half = build(DomainNet(str(tmp_path), domains=["sketch", "clipart"]), train_fraction=0.5)
    assert np.bincount(half.train.domains * 10 + half.train.labels).tolist() == [1] * 20  # per (domain, class)


def test_domainnet_all_345_classes(tmp_path):
    classes = {f"class_{i:03d}": i for i in range(345)}
    ds = build(DomainNet(str(write_domainnet(tmp_path, ["real"], classes)), domains=["real"], classes=345))
    assert ds.num_classes == 345 and ds.classnames[7] == "class 007" and counts(ds.test, 345) == [1] * 345
    for split in ("train", "test"):  # one class short in both split files
        listing = tmp_path / f"real_{split}.txt"
        listing.write_text("".join(line + "\n" for line in listing.read_text().splitlines() if "class_344" not in line))
    with pytest.raises(DataUnavailableError, match="list 344 classes"):
        build(DomainNet(str(tmp_path), domains=["real"], classes=345))
    with pytest.raises(DataUnavailableError, match="dataset.classes must be 10 or 345, got 11"):
        build(DomainNet(str(tmp_path), domains=["real"], classes=11))


def test_officehome_holdout(tmp_path):
    root = str(write_officehome(tmp_path))
    OfficeHome(root, domains=["real_world", "Art"]).check()
    ds = build(OfficeHome(root, holdout_fraction=0.2, holdout_seed=0))
    assert ds.domain_names == ["Art", "Clipart", "Product", "Real_World"] and ds.classnames[3] == "class 03"
    assert ds.template == "a photo of a {}."
    assert len(ds.test) == 4 * 65 and len(ds.train) == 4 * 65 * 2  # round(0.2 * 3) = 1 held out per cell
    cells = np.bincount(ds.test.domains * 65 + ds.test.labels, minlength=4 * 65)
    assert cells.tolist() == [1] * (4 * 65)
    assert not set(ds.train.paths) & set(ds.test.paths)
    again = build(OfficeHome(root, holdout_seed=0), seed=5)  # run.seed does not move the test set
    assert again.test.paths == ds.test.paths
    assert build(OfficeHome(root, holdout_seed=1)).test.paths != ds.test.paths
    with pytest.raises(DataUnavailableError, match=r"dataset.holdout_fraction must be in \(0, 1\), got 1.0"):
        build(OfficeHome(root, holdout_fraction=1.0))


def test_stratified_holdout_counts_and_seed():
    groups = np.array([0, 0, 0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3])
    held = stratified_holdout(groups, 0.4, seed=3)
    assert [int(held[groups == g].sum()) for g in range(4)] == [2, 1, 0, 4]  # 2 of 5, 1 of 2, none of 1, 4 of 10
    assert np.array_equal(held, stratified_holdout(groups, 0.4, seed=3))
    assert held[groups == 2].sum() == 0 and stratified_holdout(groups, 0.99, seed=0)[groups == 1].sum() == 1


# ---------------------------------------------------------------- broken layouts


def test_missing_split_file_names_path_and_what_is_there(tmp_path):
    write_dtd(tmp_path)
    (tmp_path / "val.txt").unlink()
    with pytest.raises(DataUnavailableError) as err:
        DTD(str(tmp_path)).check()
    assert f"{tmp_path}/val.txt" in str(err.value) and "found only: class_names.txt, test, test.txt" in str(err.value)
    with pytest.raises(DataUnavailableError, match="CUB_200_2011 does not exist; found only: class_names.txt"):
        CUB(str(tmp_path)).check()
    with pytest.raises(DataUnavailableError, match="split_zhou_UCF101.json"):
        UCF101(str(tmp_path / "nowhere")).check()


def test_missing_listed_image(tmp_path):
    write_dtd(tmp_path)
    (tmp_path / "test/zig_zag/zig_zag_test0.jpg").unlink()
    with pytest.raises(DataUnavailableError) as err:
        build(DTD(str(tmp_path)))
    message = str(err.value)
    assert "1 of the 3 images listed in" in message and "test.txt are missing" in message
    assert "zig_zag/zig_zag_test0.jpg" in message


def test_empty_class_and_mismatched_names(tmp_path):
    write_dtd(tmp_path / "extra")
    lines(tmp_path / "extra/class_names.txt", ["banded", "polka-dotted", "zig_zag", "woven"])
    with pytest.raises(DataUnavailableError, match=r"1 of 4 classes have no images in train.txt \+ val.txt: 'woven'"):
        build(DTD(str(tmp_path / "extra")))
    write_dtd(tmp_path / "short")
    lines(tmp_path / "short/class_names.txt", ["banded", "polka-dotted"])
    with pytest.raises(DataUnavailableError, match=r"label 2 is outside 0..1: .*class_names.txt names 2 classes"):
        build(DTD(str(tmp_path / "short")))
    cub = write_cub(tmp_path / "cub")
    lines(cub / "CUB_200_2011/classes.txt", ["1 001.Black_footed_Albatross"])
    with pytest.raises(DataUnavailableError, match="has class 2 but classes.txt has 1 classes"):
        build(CUB(str(cub)))
    with pytest.raises(DataUnavailableError, match="has 1 names but there are 2 classes"):
        names = tmp_path / "names.txt"
        names.write_text("one\n")
        build(RESISC45(str(write_resisc45(tmp_path / "resisc"))), classnames_file=str(names))


def test_resisc45_image_of_unknown_class(tmp_path):
    write_resisc45(tmp_path)
    meta = json.loads((tmp_path / "test.json").read_text())
    meta["images"][0]["file_name"] = "test.zip@harbor/harbor_001.jpg"
    (tmp_path / "test.json").write_text(json.dumps(meta))
    with pytest.raises(DataUnavailableError, match="harbor_001.jpg' is not '<class_folder>/<image>' with a class"):
        build(RESISC45(str(tmp_path)))


def test_unknown_domain_and_domains_on_single_domain_data(tmp_path):
    with pytest.raises(DataUnavailableError, match="dataset.domains=.*: domainnet has the domains clipart, .*; unknown: cartoon"):
        DomainNet(str(tmp_path), domains=["clipart", "cartoon"]).check()
    with pytest.raises(DataUnavailableError, match="officehome has the domains Art, .*; give at least one"):
        OfficeHome(str(tmp_path), domains=[]).check()
    parser = ArgumentParser(exit_on_error=False)  # only the multi-domain datasets have domains
    parser.add_argument("--dataset", type=Dataset)
    with pytest.raises(ArgumentError, match="Option 'domains' is not accepted"):
        parser.parse_args(["--dataset", "DTD", "--dataset.root", str(tmp_path), "--dataset.domains", "[clipart]"])
    with pytest.raises(DataUnavailableError, match="clipart_train.txt"):
        DomainNet(str(tmp_path)).check()


def test_officehome_domains_must_share_classes(tmp_path):
    write_officehome(tmp_path, per_class=1)
    (tmp_path / "Clipart" / "Class_07" / "00000.jpg").unlink()
    (tmp_path / "Clipart" / "Class_07").rmdir()
    with pytest.raises(DataUnavailableError, match="Clipart \\(the same in every domain\\); found 64, differing"):
        build(OfficeHome(str(tmp_path)))


def test_missing_cifar100_offline_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setattr("fedur.data.cifar.reachable", lambda host: False)
    with pytest.raises(DataUnavailableError, match="cifar-100-python.tar.gz") as err:
        CIFAR100(str(tmp_path), download=True).check()
    assert f"{tmp_path}/cifar-100-python/" in str(err.value)


# ---------------------------------------------------------------- report


def test_report_counts_per_domain_and_totals(tmp_path):
    ds = build(DomainNet(str(write_domainnet(tmp_path, ["clipart", "real"])), domains=["real", "clipart"]))
    report = dataset_report(ds)
    assert report.splitlines()[0] == "domainnet: 10 classes, 40 train / 20 test images, template 'a photo of a {}.'"
    assert "domains (2): real, clipart" in report
    zebra = next(line for line in report.splitlines() if " zebra " in line)
    assert zebra.split() == ["0", "zebra", "2", "1", "2", "1", "4", "2"]
    assert report.splitlines()[-1].split() == ["total", "20", "10", "20", "10", "40", "20"]
    ds.test = ds.test.subset(np.flatnonzero(ds.test.labels != 3))
    assert "no images in test of real for 1 classes: headphones" in dataset_report(ds)


def test_cifar_archives_match_torchvision():
    from torchvision.datasets import CIFAR10, CIFAR100

    for archive, source in ((CIFAR["cifar10"], CIFAR10), (CIFAR["cifar100"], CIFAR100)):
        assert (archive.url, archive.tgz_md5, archive.folder) == (source.url, source.tgz_md5, source.base_folder)
        assert (archive.meta_file, archive.names_key) == (source.meta["filename"], source.meta["key"])
        assert list(archive.train_files) == [f for f, _ in source.train_list]
        assert list(archive.test_files) == [f for f, _ in source.test_list]
