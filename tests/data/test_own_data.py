"""Clients' own folders (dataset ClientFolders) and splits read from a file: what they load, and each bad
layout or split file refused in one line that names the entry, before any image is decoded."""

import json

import numpy as np
import pytest

from fedur.app.cli import parse_config
from fedur.app.main import main
from fedur.app.settle import settle_num_clients
from fedur.data.clients import ClientFolders
from fedur.data.datasets import DataOptions, DataUnavailableError, prepare_dataset
from fedur.data.images import ImageSplit
from fedur.data.partition import PartitionError, PartitionSpec, split_clients
from fedur.data.split_file import count_clients, image_ids, keep_rows, part_ids, read_split_file
from fedur.errors import ConfigError

from ..own_data import write_client_folders, write_images


def load(root, classnames, **options):
    return prepare_dataset(ClientFolders(str(root)), DataOptions(classnames_file=str(classnames), **options), seed=0)


def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("test", ["own", "unlabelled", "shared", "none"])
def test_client_folders_load_each_client_and_no_train_label(tmp_path, test):
    names = write_client_folders(tmp_path, clients=3, classes=4, train_per_client=8, test_per_client=8, test=test)
    data = load(tmp_path, names)
    assert data.client_names == ["site_00", "site_01", "site_02"] and data.classnames == ["circle", "square", "triangle", "star"]
    assert data.train.labels is None and data.train.clients.tolist() == [0] * 8 + [1] * 8 + [2] * 8
    assert all("/clients/site_0" in p and "/train/" in p for p in data.train.paths)
    train_parts, test_parts = split_clients(PartitionSpec("clients", 3, 0.1, 0.2, 3, 0, 10), data.train, data.test)
    assert [p.tolist() for p in train_parts] == [list(range(8)), list(range(8, 16)), list(range(16, 24))]
    if test == "own":  # labelled by their class folder, each client its own
        assert data.test.labels is not None and len(data.test) == 24
        for k, part in enumerate(test_parts):
            assert all(f"/site_{k:02d}/test/{data.classnames[data.test.labels[i]]}/" in data.test.paths[i] for i in part)
    if test == "unlabelled":
        assert data.test.labels is None and [len(p) for p in test_parts] == [8, 8, 8]
    if test == "shared":  # every client is tested on the whole shared test set
        assert data.test.clients is None and all(p.tolist() == list(range(12)) for p in test_parts)
    if test == "none":
        assert len(data.test) == 0 and all(len(p) == 0 for p in test_parts)


def test_fractions_keep_every_clients_share(tmp_path):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=10, test="none")
    data = load(tmp_path, names, train_fraction=0.5)
    assert np.bincount(data.train.clients).tolist() == [5, 5]


def test_bad_client_layouts_are_one_line(tmp_path):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=6, test_per_client=6, test="own")
    (tmp_path / "clients" / "site_02" / "train" / "dog").mkdir(parents=True)  # a client with a class folder, no image
    with pytest.raises(DataUnavailableError) as err:
        ClientFolders(str(tmp_path)).check()
    assert "client 'site_02' has no train images" in one_line(err) and "without class folders" in one_line(err)
    (tmp_path / "clients" / "site_02" / "train" / "dog").rmdir()
    (tmp_path / "clients" / "site_02" / "train").rmdir()
    (tmp_path / "clients" / "site_02").rmdir()

    unknown = tmp_path / "clients" / "site_01" / "test" / "hexagon"
    write_images(unknown, np.zeros((1, 8, 8, 3), dtype=np.uint8))
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, names)
    assert f"test class folder {unknown} is not a class of data.classnames_file" in one_line(err)
    for file in unknown.iterdir():
        file.unlink()
    unknown.rmdir()

    with pytest.raises(DataUnavailableError) as err:
        prepare_dataset(ClientFolders(str(tmp_path)), DataOptions(), seed=0)
    assert "needs data.classnames_file" in one_line(err) or "give data.classnames_file" in one_line(err)
    write_images(tmp_path / "test" / "circle", np.zeros((1, 8, 8, 3), dtype=np.uint8))
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, names)
    assert "keep one of the two" in one_line(err)


def test_the_number_of_clients_comes_from_the_folders(tmp_path):
    names = write_client_folders(tmp_path, clients=3, classes=3, train_per_client=4, test="none")
    base = ["--config", "configs/tiny.yaml", "--dataset", "ClientFolders", "--dataset.root", str(tmp_path),
            "--data.classnames_file", str(names)]
    cfg = parse_config([*base, "--federation.partition", "clients"])
    assert settle_num_clients(cfg) == 3 and cfg.federation.num_clients == 3 and cfg.settings["federation"]["num_clients"] == 3
    cfg = parse_config(base)  # tiny.yaml's dirichlet split
    with pytest.raises(ConfigError, match="brings its own 3 clients: set federation.partition=clients"):
        settle_num_clients(cfg)
    cfg = parse_config(["--config", "configs/tiny.yaml", "--federation.partition", "clients"])
    with pytest.raises(ConfigError, match="dataset Synthetic has none: use dataset ClientFolders"):
        settle_num_clients(cfg)


def splits(n_train=6, n_test=4, root=None):
    paths = None if root is None else [f"{root}/img_{i}.png" for i in range(n_train)]
    train = ImageSplit(np.zeros(n_train, dtype=np.int64), paths=paths, arrays=None if root else np.zeros((n_train, 2, 2, 3)))
    test = ImageSplit(np.zeros(n_test, dtype=np.int64), arrays=np.zeros((n_test, 2, 2, 3)))
    return train, test


def write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_split_file_json_and_csv_read_back(tmp_path):
    train, test = splits(root=tmp_path / "data")
    ids = image_ids(train, str(tmp_path / "data"))
    assert ids == [f"img_{i}.png" for i in range(6)]
    parts = [np.array([4, 0, 2]), np.array([1, 3, 5])]
    given = {"train_ids": part_ids(parts, ids), "test_ids": [[0, 3], [2, 1]]}
    assert given["train_ids"][0] == ["img_4.png", "img_0.png", "img_2.png"]
    got_train, got_test, _ = read_split_file(write(tmp_path / "s.json", given), train, test, str(tmp_path / "data"))
    assert [p.tolist() for p in got_train] == [[4, 0, 2], [1, 3, 5]] and [p.tolist() for p in got_test] == [[0, 3], [2, 1]]
    csv = "client,image,split\n1,img_1.png,train\n0,img_0.png,train\n1,img_5.png,train\n0,img_2.png,train\n" \
          "0,img_3.png,train\n0,img_4.png,train\n"
    got_train, got_test, _ = read_split_file(write(tmp_path / "s.csv", csv), train, test, str(tmp_path / "data"))
    assert [p.tolist() for p in got_train] == [[0, 2, 3, 4], [1, 5]] and got_test is None  # no test lines: shared
    assert count_clients(str(tmp_path / "s.csv")) == 2
    assert [p.tolist() for p in keep_rows([np.array([4, 0, 2])], np.array([0, 1, 4, 5]))] == [[2, 0]]  # row 2 skipped


@pytest.mark.parametrize("content, message", [
    ({"train_ids": [[0, 1, 2], [3, 4, 4, 5]]}, "train_ids[1][2] = 4 names a train image already listed at train_ids[1][1]"),
    ({"train_ids": [[0, 1, 2], [3, 4, 9]]}, "train_ids[1][2] = 9 is not an index of the 6 train images"),
    ({"train_ids": [[0, 1, 2, 3, 4, 5], []]}, "client 1 has no train image"),
    ({"train_ids": [[0, 1, 2], [3, 4]]}, "1 of the 6 train images are in no client, e.g. 5"),
    ({"train_ids": [[0, 1, 2], [3, 4, 5]], "test_ids": [[0, 1], [1, 2, 3]]}, "test_ids[1][0] = 1 names a test image already"),
    ({"train_ids": [[0, 1, 2], [3, 4, "x.png"]]}, "train_ids[1][2] = 'x.png': this dataset's images are not files"),
    ({"clients": []}, "s.json: no 'train_ids' list"),
    ("client,image\n0,0\n0,1\n2,2\n2,3\n2,4\n2,5\n", "client 1 has no train image"),
    ("image\n0\n", "the first line must name the columns client and image"),
])
def test_bad_split_files_are_one_line_naming_the_entry(tmp_path, content, message):
    train, test = splits()
    path = write(tmp_path / ("s.csv" if isinstance(content, str) else "s.json"), content)
    with pytest.raises(PartitionError) as err:
        read_split_file(path, train, test, None)
    assert message in one_line(err)


def test_an_unknown_path_names_the_entry_and_the_id_form(tmp_path):
    train, test = splits(root=tmp_path)
    ids = [["img_0.png", "img_1.png", "img_2.png"], ["img_3.png", "img_4.png", "other/img_5.png"]]
    path = write(tmp_path / "s.json", {"train_ids": ids})
    with pytest.raises(PartitionError) as err:
        read_split_file(path, train, test, str(tmp_path))
    assert "train_ids[1][2] = 'other/img_5.png' is not a train image of the dataset (ids are paths relative to " \
           "dataset.root, e.g. 'img_0.png')" in one_line(err)


def test_a_split_file_naming_an_image_twice_stops_the_run_before_it_starts(tmp_path, capsys):
    split = write(tmp_path / "split.json", {"train_ids": [list(range(150)), list(range(149, 300))]})
    with pytest.raises(SystemExit) as stop:
        main(["--config", "configs/tiny.yaml", "--federation.partition", "file", "--federation.partition_file", split,
              "--run.output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and not (tmp_path / "run").exists()
    assert "train_ids[1][0] = 149 names a train image already listed at train_ids[0][149]" in err


def test_check_data_lists_the_clients(tmp_path, capsys):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=5, test="shared")
    main(["--config", "configs/tiny.yaml", "--dataset", "ClientFolders", "--dataset.root", str(tmp_path),
          "--data.classnames_file", str(names), "--federation.partition", "clients", "--check_data"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "clientfolders: 2 clients, 10 train images (unlabelled) / 9 test images"
    assert out[2] == "test images: one shared labelled set of 9 images, every client tested on it"
    assert out[-2:] == ["     0  site_00          5    shared", "     1  site_01          5    shared"]


@pytest.mark.parametrize("client", [1, 2])  # the last one too: the client count comes from the folders
def test_a_client_whose_images_are_all_unreadable_stops_the_run_in_one_line(tmp_path, capsys, client):
    names = write_client_folders(tmp_path, clients=3, classes=3, train_per_client=5, test="none")
    for image in (tmp_path / "clients" / f"site_0{client}" / "train").iterdir():
        image.write_bytes(b"not an image")  # skipped as unreadable: the client is left with nothing
    with pytest.raises(SystemExit) as stop:
        main(["--config", "configs/tiny.yaml", "--dataset", "ClientFolders", "--dataset.root", str(tmp_path),
              "--data.classnames_file", str(names), "--federation.partition", "clients",
              "--data.corrupt_images", "skip", "--data.cache", "false", "--run.output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and not (tmp_path / "run").exists()
    assert err[-1] == (f"fedur: error: client(s) {client} have no train image left once the unreadable ones were skipped "
                       "(data.corrupt_images: skip); fix or remove those images, or drop the client from the split")


def test_more_bad_split_files_each_one_line(tmp_path):
    train, test = splits(root=tmp_path)
    mixed = write(tmp_path / "mixed.json", {"train_ids": [[0, "img_1.png", "img_2.png"], ["img_3.png", "img_4.png", "img_5.png"]]})
    with pytest.raises(PartitionError) as err:
        read_split_file(mixed, train, test, str(tmp_path))
    assert "train_ids[0][1] = 'img_1.png' is a path but train_ids[0][0] is an index; give every id of a file in one " \
           "kind" in one_line(err)
    csv = write(tmp_path / "s.csv", "client,image\n0,img_0.png\n0,img_1.png\n1,img_2.png\n1,img_3.png\n1,img_3.png\n"
                                    "1,img_4.png\n1,img_5.png\n")
    with pytest.raises(PartitionError) as err:
        read_split_file(csv, train, test, str(tmp_path))
    assert f"{csv}:6: image 'img_3.png' names a train image already listed at line 5" in one_line(err)
    no_test = ImageSplit(np.zeros(0, dtype=np.int64), arrays=np.zeros((0, 2, 2, 3)))
    given = write(tmp_path / "t.json", {"train_ids": [[0, 1, 2], [3, 4, 5]], "test_ids": [[0], []]})
    with pytest.raises(PartitionError) as err:
        read_split_file(given, splits()[0], no_test, None)
    assert "the dataset has no test images; drop the file's test ids" in one_line(err)
    (tmp_path / "latin1.csv").write_bytes("client,image\n0,caf\xe9.png\n".encode("latin-1"))
    with pytest.raises(PartitionError) as err:
        read_split_file(str(tmp_path / "latin1.csv"), train, test, str(tmp_path))
    assert f"{tmp_path / 'latin1.csv'}:2: not UTF-8 text (byte 0xe9); save the file as UTF-8" in one_line(err)


def test_a_csv_with_a_byte_order_mark_and_skipped_ids_read_back(tmp_path):
    train, test = splits(root=tmp_path)
    (tmp_path / "bom.csv").write_bytes("client,image\n0,img_0.png\n0,img_1.png\n1,img_2.png\n1,img_3.png\n"
                                       "1,img_4.png\n1,img_5.png\n".encode("utf-8-sig"))  # as Excel saves it
    parts, shared, _ = read_split_file(str(tmp_path / "bom.csv"), train, test, str(tmp_path))
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3, 4, 5]] and shared is None
    # a run that skipped unreadable images lists them apart, so that its partition.json replays
    skipped = write(tmp_path / "p.json", {"train_ids": [["img_0.png"], ["img_2.png", "img_5.png"]],
                                          "skipped_ids": {"train": ["img_1.png", "img_3.png", "img_4.png"], "test": []}})
    parts, _, _ = read_split_file(skipped, train, test, str(tmp_path))
    assert [p.tolist() for p in parts] == [[0], [2, 5]]
    twice = write(tmp_path / "q.json", {"train_ids": [["img_0.png", "img_1.png"], ["img_2.png", "img_5.png"]],
                                        "skipped_ids": {"train": ["img_1.png", "img_3.png", "img_4.png"]}})
    with pytest.raises(PartitionError) as err:
        read_split_file(twice, train, test, str(tmp_path))
    assert "train_ids[0][1] = 'img_1.png' names a train image already listed at skipped_ids.train[0]" in one_line(err)


def test_class_names_given_twice_and_test_folders_mixing_classes_and_images_are_refused(tmp_path):
    names = write_client_folders(tmp_path, clients=2, classes=3, train_per_client=6, test_per_client=6, test="own")
    twice = tmp_path / "twice.txt"
    twice.write_text("circle\nsquare\ncircle\n")
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, twice)
    assert f"{twice}:3: class 'circle' is named again (first at line 1, '_' read as a space)" in one_line(err)
    loose = tmp_path / "clients" / "site_00" / "test"
    write_images(loose, np.zeros((1, 8, 8, 3), dtype=np.uint8))  # an image beside the class folders
    with pytest.raises(DataUnavailableError) as err:
        load(tmp_path, names)
    assert f"{loose} holds class folders and images beside them" in one_line(err)
