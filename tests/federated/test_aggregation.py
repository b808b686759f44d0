import pytest
import torch

from fedur.federated.aggregation import weighted_average


def test_weighted_by_selected_counts():
    stacked = torch.tensor([[1.0, 1.0], [3.0, 5.0], [10.0, 10.0]])
    out = weighted_average(stacked, torch.tensor([1, 3, 0]))
    assert out.tolist() == pytest.approx([2.5, 4.0])  # 1/4 * [1, 1] + 3/4 * [3, 5]; weight 0 ignored


def test_all_zero_weights_give_none():
    assert weighted_average(torch.ones(2, 3), torch.tensor([0, 0])) is None


def test_bad_weights_raise():
    with pytest.raises(ValueError):
        weighted_average(torch.ones(2, 3), torch.tensor([1, -1]))
    with pytest.raises(ValueError):
        weighted_average(torch.ones(2, 3), torch.tensor([1, 1, 1]))
