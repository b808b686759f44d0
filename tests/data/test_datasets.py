import numpy as np
import pytest
from PIL import Image

from fedur.data.datasets import DataUnavailableError, build_dataset, check_available, load_imagefolder, make_synthetic


def write_folder(root, layout):
    """layout: {split: {class: n_images}}; writes small PNGs."""
    for split, classes in layout.items():
        for name, n in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(np.full((8, 8, 3), 10 * i, dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def test_imagefolder_counts_labels_and_names(tmp_path):
    root = write_folder(tmp_path, {"train": {"sea_lion": 3, "ant": 2}, "test": {"sea_lion": 1, "ant": 2}})
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")
    ds = load_imagefolder(str(root))
    assert ds.classnames == ["ant", "sea lion"]  # sorted folders, '_' read as a space
    assert np.bincount(ds.train.labels).tolist() == [2, 3]
    assert np.bincount(ds.test.labels).tolist() == [2, 1]
    assert ds.train.load(0).mode == "RGB" and ds.train.load(0).size == (8, 8)


def test_classnames_file(tmp_path):
    root = write_folder(tmp_path, {"train": {"a": 1, "b": 1}, "test": {"a": 1, "b": 1}})
    names = tmp_path / "names.txt"
    names.write_text("red_panda\nkoala\n")
    assert load_imagefolder(str(root), str(names)).classnames == ["red panda", "koala"]
    names.write_text("only one\n")
    with pytest.raises(DataUnavailableError, match="has 1 names but there are 2 classes"):
        load_imagefolder(str(root), str(names))


def test_wrong_layouts_name_the_path(tmp_path):
    write_folder(tmp_path / "no_test", {"train": {"a": 1}})
    with pytest.raises(DataUnavailableError, match="no_test/test is missing"):
        load_imagefolder(str(tmp_path / "no_test"))
    write_folder(tmp_path / "empty", {"train": {"a": 1, "b": 0}, "test": {"a": 1, "b": 1}})
    with pytest.raises(DataUnavailableError, match="empty/train/b has no images"):
        load_imagefolder(str(tmp_path / "empty"))
    write_folder(tmp_path / "mismatch", {"train": {"a": 1, "b": 1}, "test": {"a": 1, "c": 1}})
    with pytest.raises(DataUnavailableError, match="only in train: \\['b'\\]"):
        load_imagefolder(str(tmp_path / "mismatch"))


def test_corrupt_image_is_reported_by_path(tmp_path):
    root = write_folder(tmp_path, {"train": {"a": 1}, "test": {"a": 1}})
    (root / "train" / "a" / "0.png").write_bytes(b"not a png")
    with pytest.raises(DataUnavailableError, match="0.png"):
        load_imagefolder(str(root)).train.load(0)


def test_synthetic_is_deterministic_with_separate_train_and_test_streams():
    a, b = make_synthetic(4, 5, 2, 16, seed=3), make_synthetic(4, 5, 2, 16, seed=3)
    assert np.array_equal(a.train.arrays, b.train.arrays) and np.array_equal(a.test.arrays, b.test.arrays)
    assert a.classnames == ["circle", "square", "triangle", "star"] and len(a.test) == 8
    assert not np.array_equal(a.train.arrays[:8], a.test.arrays), "the test split is drawn from its own stream"
    assert not np.array_equal(make_synthetic(4, 5, 2, 16, seed=4).train.arrays, a.train.arrays)
    with pytest.raises(DataUnavailableError, match=r"synthetic_classes must be in \[2, 10\]"):
        make_synthetic(11, 5, 2, 16, seed=3)


def test_fractions_keep_every_class(tmp_path):
    ds = build_dataset("synthetic", None, train_fraction=0.1, synthetic_classes=5, synthetic_train_per_class=40)
    assert np.bincount(ds.train.labels).tolist() == [4] * 5
    with pytest.raises(DataUnavailableError, match="fractions"):
        build_dataset("synthetic", None, train_fraction=1.5)


def test_template_must_have_one_slot():
    with pytest.raises(DataUnavailableError, match="exactly one"):
        build_dataset("synthetic", None, template="a photo")


def test_missing_cifar10_offline_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setattr("fedur.data.cifar.reachable", lambda host: False)
    with pytest.raises(DataUnavailableError) as err:
        check_available("cifar10", str(tmp_path), download=True)
    assert "cifar-10-python.tar.gz" in str(err.value) and f"data.root={tmp_path}" in str(err.value)
    with pytest.raises(DataUnavailableError, match="needs data.root"):
        check_available("cifar10", None, download=True)
