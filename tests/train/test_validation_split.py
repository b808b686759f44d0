"""The label-free validation split (data.validation_fraction): drawn from each client's own stream, named by a split
file, and every setting that cannot hold refused in one line before any compute."""

import json

import numpy as np
import pytest

from fedur.app.cli import parse_config
from fedur.app.settle import settle
from fedur.data.partition import PartitionError
from fedur.data.split_file import names_validation, read_split_file
from fedur.errors import ConfigError
from fedur.federated.streams import validation_count, validation_positions
from fedur.launch_env import LaunchEnv
from fedur.train.setup import set_aside

from ..data.test_own_data import splits, write


def test_each_client_sets_aside_its_share_from_its_own_stream():
    parts = [np.arange(10, 20), np.arange(0, 10), np.arange(20, 23)]
    kept, validation = set_aside(parts, None, 0.2, seed=1)
    assert [len(v) for v in validation] == [2, 2, 1]  # round(0.2 n), at least one
    for part, k, v in zip(parts, kept, validation):
        assert sorted(np.concatenate([k, v]).tolist()) == sorted(part.tolist()) and not set(k) & set(v)
        assert np.all(np.diff(np.searchsorted(part, k)) > 0)  # the train rows keep their order
    other = set_aside([np.arange(100, 150), parts[1], parts[2]], None, 0.2, seed=1)[1]  # client 0 holds other images:
    assert [v.tolist() for v in other[1:]] == [v.tolist() for v in validation[1:]]  # clients 1 and 2 draw the same
    again = set_aside(parts, None, 0.2, seed=1)[1]
    assert [v.tolist() for v in again] == [v.tolist() for v in validation]  # a resume draws the same
    other = set_aside(parts, None, 0.2, seed=2)[1]
    assert [v.tolist() for v in other] != [v.tolist() for v in validation]  # the run's seed draws it


def test_a_clients_draw_depends_on_its_id_and_size_only():
    assert validation_positions(3, 5, 40, 8).tolist() == validation_positions(3, 5, 40, 8).tolist()
    assert validation_positions(3, 5, 40, 8).tolist() != validation_positions(3, 6, 40, 8).tolist()
    assert validation_count(10, 0.0) == 0 and validation_count(10, 0.01) == 1 and validation_count(10, 0.25) == 3


def test_no_fraction_keeps_the_split_as_it_was_and_a_named_split_wins():
    parts = [np.arange(5), np.arange(5, 9)]
    kept, validation = set_aside(parts, None, 0.0, seed=1)
    assert validation is None and all(a is b for a, b in zip(kept, parts))
    named = [np.array([9]), np.array([10])]
    assert set_aside(parts, named, 0.3, seed=1)[1] is named


def test_a_fraction_that_leaves_a_client_nothing_to_train_is_refused_in_one_line():
    with pytest.raises(PartitionError, match=r"data.validation_fraction=0.9 sets all 2 train image\(s\) of client 1 aside") as err:
        set_aside([np.arange(10), np.arange(10, 12)], None, 0.9, seed=1)
    assert "\n" not in str(err.value)


def test_a_split_file_names_the_validation_images(tmp_path):
    train, test = splits()
    path = write(tmp_path / "s.json", {"train_ids": [[0, 1], [3, 4]], "validation_ids": [[2], [5]], "test_ids": None})
    got = read_split_file(path, train, test, None)
    assert [p.tolist() for p in got.train] == [[0, 1], [3, 4]] and [p.tolist() for p in got.validation] == [[2], [5]]
    assert names_validation(path)
    csv = write(tmp_path / "s.csv", "client,image,split\n0,0,train\n0,1,validation\n1,2,train\n1,3,train\n1,4,train\n1,5,validation\n")
    got = read_split_file(csv, train, test, None)
    assert [p.tolist() for p in got.train] == [[0], [2, 3, 4]] and [p.tolist() for p in got.validation] == [[1], [5]]
    assert not names_validation(write(tmp_path / "plain.json", {"train_ids": [[0, 1, 2], [3, 4, 5]]}))


def test_a_validation_image_also_in_train_ids_is_refused(tmp_path):
    train, test = splits()
    path = write(tmp_path / "s.json", {"train_ids": [[0, 1, 2], [3, 4, 5]], "validation_ids": [[2], []]})
    with pytest.raises(PartitionError, match=r"validation_ids\[0\]\[0\] = 2 names a train image already listed at train_ids\[0\]\[2\]"):
        read_split_file(path, train, test, None)


TINY = ["--config", "configs/tiny.yaml"]


@pytest.mark.parametrize("flags, message", [
    (["--evaluation.select", "label_free"], "there is none: set data.validation_fraction"),
    (["--evaluation.select", "label_free", "--data.validation_fraction", "0.2", "--evaluation.estimator", "agreement_zero_shot"],
     "cannot choose by evaluation.estimator agreement_zero_shot"),
    (["--evaluation.select", "label_free", "--data.validation_fraction", "0.2", "--method", "ZeroShot"],
     "ZeroShot has no rounds"),
])
def test_label_free_settings_that_cannot_hold_are_refused_before_anything_loads(flags, message):
    with pytest.raises(ConfigError, match=message) as err:
        settle(parse_config([*TINY, *flags]), LaunchEnv.read({}))
    assert "\n" not in str(err.value)


def test_a_split_file_with_validation_ids_is_a_validation_split(tmp_path):
    partition = {"train_ids": [list(range(0, 70)), list(range(70, 140)), list(range(140, 220)), list(range(220, 290))],
                 "validation_ids": [[290], [291], [292], [293, 294, 295, 296, 297, 298, 299]], "test_ids": None}
    path = write(tmp_path / "p.json", json.dumps(partition))
    cfg = settle(parse_config([*TINY, "--federation.partition", "file", "--federation.partition_file", path,
                               "--evaluation.select", "label_free"]), LaunchEnv.read({}))
    assert cfg.evaluation.select == "label_free" and cfg.federation.num_clients == 4
