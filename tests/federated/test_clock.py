"""The virtual clock (fedur/federated/clock.py) on hand-written rounds: each asked client's time, the deadline in
both units, late uploads dropped or cut short, over-selection, and how long the server waits."""

import pytest
import torch

from fedur.federated.clock import Deadline, arrivals, client_seconds, deadline_seconds, median, planned_steps

T, F = True, False


def mask(*values):
    return torch.tensor(values, dtype=torch.bool)


def test_a_clients_time_is_its_steps_over_its_speed_plus_its_upload_over_its_bandwidth():
    steps = torch.tensor([10, 4, 0])
    speeds = torch.tensor([2.0, 1.0, 4.0], dtype=torch.float64)
    assert client_seconds(steps, speeds, 100, None).tolist() == [5.0, 4.0, 0.0]
    bandwidths = torch.tensor([50.0, 100.0, 25.0], dtype=torch.float64)
    assert client_seconds(steps, speeds, 100, bandwidths).tolist() == [7.0, 5.0, 4.0]


def test_the_median_is_numpys_and_the_deadline_scales_it():
    assert median(torch.tensor([1.0, 3.0, 10.0, 2.0])) == 2.5  # the two middle values' mean
    seconds = torch.tensor([1.0, 3.0, 10.0, 2.0, 100.0], dtype=torch.float64)
    asked = mask(T, T, T, T, F)  # the one not asked does not count
    assert deadline_seconds(0.8, "median", seconds, asked) == pytest.approx(2.0)
    assert deadline_seconds(7.0, "seconds", seconds, asked) == 7.0
    assert deadline_seconds(None, "median", seconds, asked) is None


def test_every_asked_client_answers_when_nothing_is_lost_and_there_is_no_deadline():
    got = arrivals(mask(T, F, T), torch.tensor([4, 4, 6]), torch.ones(3, dtype=torch.float64), 0, None, mask(F, F, F))
    assert got.accepted.tolist() == [T, F, T]
    assert got.budget.tolist() == [4, 0, 6]
    assert got.round_seconds == 6.0  # the last asked client's arrival
    assert not got.late.any() and not got.lost.any() and not got.surplus.any()


def test_a_lost_upload_is_not_taken_and_the_server_waits_until_it_would_have_arrived():
    got = arrivals(mask(T, T, T), torch.tensor([2, 8, 4]), torch.ones(3, dtype=torch.float64), 0, None, mask(F, T, F))
    assert got.accepted.tolist() == [T, F, T]
    assert got.lost.tolist() == [F, T, F] and got.answered.tolist() == [T, F, T]
    assert got.round_seconds == 8.0


def test_a_deadline_drops_the_late_uploads_and_ends_the_round():
    steps = torch.tensor([2, 4, 6, 20])  # speed 1: times 2, 4, 6, 20; median 5
    got = arrivals(mask(T, T, T, T), steps, torch.ones(4, dtype=torch.float64), 0, None, mask(F, F, F, F),
                   Deadline(1.0, "median", "drop"))
    assert got.deadline_seconds == 5.0
    assert got.late.tolist() == [F, F, T, T]
    assert got.accepted.tolist() == [T, T, F, F]
    assert got.budget.tolist() == [2, 4, 6, 20]  # dropped late clients trained all their steps
    assert got.round_seconds == 5.0


def test_partial_work_takes_the_steps_a_late_client_finishes_in_time_to_send():
    steps = torch.tensor([2, 10, 10])
    speeds = torch.tensor([1.0, 1.0, 0.1], dtype=torch.float64)  # times 2 + 1, 10 + 1, 100 + 1 (upload 1 s each)
    bandwidths = torch.full((3,), 10.0, dtype=torch.float64)
    got = arrivals(mask(T, T, T), steps, speeds, 10, bandwidths, mask(F, F, F), Deadline(6.0, "seconds", "partial"))
    assert got.late.tolist() == [F, T, T]
    assert got.budget.tolist() == [2, 5, 0]  # (6 - 1) x 1 = 5 steps; (6 - 1) x 0.1 = 0.5: none
    assert got.accepted.tolist() == [T, T, F]  # no step in time: nothing to take
    assert got.arrival.tolist() == [3.0, 6.0, 0.0]
    assert got.round_seconds == 6.0


def test_over_selection_takes_the_first_arrivals_and_stops_waiting():
    steps = torch.tensor([9, 3, 5, 3])  # arrivals 9, 3, 5, 3
    got = arrivals(mask(T, T, T, T), steps, torch.ones(4, dtype=torch.float64), 0, None, mask(F, F, F, F), wanted=2)
    assert got.accepted.tolist() == [F, T, F, T]  # a tie at 3: both, the lower id first
    assert got.surplus.tolist() == [T, F, T, F]
    assert got.round_seconds == 3.0
    fewer = arrivals(mask(T, T, T, T), steps, torch.ones(4, dtype=torch.float64), 0, None, mask(F, T, F, T), wanted=2)
    assert fewer.accepted.tolist() == [T, F, T, F] and not fewer.surplus.any()
    assert fewer.round_seconds == 9.0  # two were lost: it waited for the slowest


def test_planned_steps_are_epochs_over_the_batches_of_the_selected_labels():
    assert planned_steps(torch.tensor([0, 1, 32, 33]), 32, 3).tolist() == [0, 3, 3, 6]
