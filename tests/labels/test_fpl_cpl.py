import math

import pytest
import torch
import torch.nn.functional as F

from fedur.labels.cpl import (
    CPL,
    candidate_sets,
    cc_loss,
    confidence_threshold,
    cpl_assign,
    cpl_pool_caps,
    cpl_quantiles,
    cpl_select,
    cpl_step_quantile,
    grip_per_class,
    inter_instance,
    intra_instance,
    soft_candidates,
)
from fedur.labels.fpl import FPL, fpl_select

# ---------------------------------------------------------------- FPL

FPL_PROBS = torch.tensor([
    [0.7, 0.2, 0.1],  # 0: class 0, .7
    [0.8, 0.1, 0.1],  # 1: class 0, .8
    [0.7, 0.1, 0.2],  # 2: class 0, .7 (ties with 0)
    [0.1, 0.6, 0.3],  # 3: class 1, .6
    [0.3, 0.3, 0.4],  # 4: class 2, .4
    [0.2, 0.2, 0.6],  # 5: class 2, .6
])


def test_fpl_top_k_per_argmax_class_ties_to_lower_index():
    indices, labels = fpl_select(FPL_PROBS, per_class=2)
    # class 0: 1 (.8), then the tie at .7 goes to sample 0 over 2; class 1 only has 3; class 2: 5 and 4
    assert indices.tolist() == [0, 1, 3, 4, 5]
    assert labels.tolist() == [0, 0, 1, 2, 2]
    indices, labels = fpl_select(FPL_PROBS, per_class=1)
    assert indices.tolist() == [1, 3, 5]
    assert labels.tolist() == [0, 1, 2]


def test_fpl_menghini_fills_other_classes_and_keeps_duplicates():
    probs = torch.tensor([
        [0.6, 0.3, 0.1],  # 0 enters board 0
        [0.7, 0.1, 0.2],  # 1 evicts 0 from board 0 (0 is never offered again)
        [0.5, 0.4, 0.1],  # 2 fails board 0, so joins the empty boards 1 (.4) and 2 (.1)
        [0.2, 0.5, 0.3],  # 3 takes board 1 from 2 (.5 > .4)
        [0.1, 0.2, 0.7],  # 4 takes board 2 from 2 (.7 > .1)
    ])
    indices, labels = fpl_select(probs[:3], per_class=1, fill_other_classes=True)
    assert indices.tolist() == [1, 2, 2]  # sample 2 sits on two leaderboards
    assert labels.tolist() == [0, 1, 2]
    indices, labels = fpl_select(probs, per_class=1, fill_other_classes=True)
    assert indices.tolist() == [1, 3, 4]
    assert labels.tolist() == [0, 1, 2]
    # the default semantics: 2 only competes for class 0, which 1 holds
    assert fpl_select(probs[:3], per_class=1)[0].tolist() == [1]


def test_fpl_menghini_compares_with_the_last_entry_not_the_minimum():
    probs = torch.tensor([
        [0.5, 0.3, 0.2],  # board 0: [(.5, 0)]
        [0.9, 0.05, 0.05],  # room left: appended unsorted -> [(.5, 0), (.9, 1)]
        [0.6, 0.1, 0.3],  # .6 beats the minimum .5 but not the last entry .9: goes to boards 2 and 1
    ])
    indices, labels = fpl_select(probs, per_class=2, fill_other_classes=True)
    assert indices.tolist() == [0, 1, 2, 2]
    assert labels.tolist() == [0, 0, 1, 2]
    assert fpl_select(probs, per_class=2)[0].tolist() == [1, 2]  # plain top-2 of class 0


def test_fpl_menghini_equal_scores_rank_lower_index_first():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.25, 0.25], [0.6, 0.2, 0.2]])
    # board 0 fills with 0 and 1 (.5 each); 2 qualifies (.5 < .6) and the sort keeps 2, then the tie at .5
    # goes to the lower index 0 (the reference would keep the larger image path)
    indices, labels = fpl_select(probs, per_class=2, fill_other_classes=True)
    assert indices.tolist() == [0, 2]
    assert labels.tolist() == [0, 0]


def test_fpl_labeller_uses_fpl_per_class():
    chosen = FPL(per_class=1).select(FPL_PROBS)
    assert chosen.indices.tolist() == [1, 3, 5]
    assert chosen.labels.tolist() == [0, 1, 2]


# ---------------------------------------------------------------- CPL candidate sets

# max-probs .6 .5 .7 .8 .4 -> sorted .4 .5 .6 .7 .8; the 0.375-quantile is at position 1.5: conf_thr = .55
CPL_PROBS = torch.tensor([
    [0.6, 0.3, 0.1],
    [0.5, 0.4, 0.1],
    [0.2, 0.7, 0.1],
    [0.1, 0.1, 0.8],
    [0.4, 0.35, 0.25],
])


def test_confidence_threshold_is_a_quantile_of_max_probs_or_their_mean():
    assert confidence_threshold(CPL_PROBS, 0.375) == pytest.approx(0.55)
    assert confidence_threshold(CPL_PROBS, 0.0) == pytest.approx(0.6)  # alpha 0: the mean (.6+.5+.7+.8+.4)/5


def test_intra_instance_keeps_classes_up_to_the_one_crossing_conf_thr():
    # row 0: cum .6 > .55 at once -> top-1 only; row 1: .5 <= .55, .9 crosses -> {0, 1};
    # row 4: .4, then .75 crosses -> {0, 1}
    expected = [[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]]
    assert intra_instance(CPL_PROBS, 0.55).int().tolist() == expected
    # a threshold above every cumulative sum keeps all classes; 0 keeps the top-1
    assert intra_instance(CPL_PROBS, 1.5).all()
    assert intra_instance(CPL_PROBS, 0.0).sum(dim=1).tolist() == [1] * 5


def test_inter_instance_keeps_values_at_or_above_the_column_quantile():
    # beta .75 -> position 3 of 5 sorted values: col 0 [.1 .2 .4 .5 .6] -> .5; col 1 [.1 .3 .35 .4 .7] -> .4;
    # col 2 [.1 .1 .1 .25 .8] -> .25. Ties at the threshold (row 1 col 0, row 1 col 1, row 4 col 2) are kept.
    expected = [[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1]]
    assert inter_instance(CPL_PROBS, 0.75).int().tolist() == expected


def test_candidate_sets_intersect_and_leave_empty_rows():
    cands = candidate_sets(CPL_PROBS, 0.375, 0.75)
    # row 4: intra {0, 1} but inter {2}: empty, dropped by the selection
    assert cands.int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]]


def test_candidate_sets_drop_negligible_renormalised_classes():
    probs = torch.tensor([[1 - 5e-8, 5e-8, 0.0], [0.5, 0.3, 0.2]], dtype=torch.float64)
    # alpha 1: conf_thr = 1 - 5e-8, so row 0's cumulative rule keeps {0, 1} and row 1 keeps all;
    # beta 0 keeps everything; class 1 of row 0 weighs 5e-8 < 1e-7 after renormalisation, class 2 weighs 0
    assert intra_instance(probs, confidence_threshold(probs, 1.0))[0].tolist() == [True, True, False]
    assert candidate_sets(probs, 1.0, 0.0).int().tolist() == [[1, 0, 0], [1, 1, 1]]


def test_candidate_sets_renormalise_the_intra_set_on_its_own():
    probs = torch.tensor([[1 - 5e-8, 5e-8, 0.0], [1 - 1e-10, 1e-10, 0.0], [1 - 1e-10, 0.0, 1e-10]], dtype=torch.float64)
    # inter (beta .5, medians 1 - 1e-10, 1e-10, 0): row 0 keeps {1, 2}, renormalised {1} (weight 1).
    # intra (alpha 1, conf_thr 1 - 1e-10): row 0 keeps {0, 1}, renormalised {0} (class 1 weighs 5e-8).
    # So row 0 is empty; without the intra renormalisation it would be {1}.
    assert candidate_sets(probs, 1.0, 0.5).int().tolist() == [[0, 0, 0], [1, 0, 0], [1, 0, 0]]


def test_soft_candidates_renormalise_within_the_set():
    soft = soft_candidates(CPL_PROBS[:2], torch.tensor([[True, True, False], [False, False, False]]))
    assert soft.tolist()[0] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert soft[1].tolist() == [0.0, 0.0, 0.0]


def test_cpl_quantile_table():
    assert cpl_quantiles("dtd") == (0.75, 0.95)
    assert cpl_quantiles("RESISC45") == (0.90, 0.97)
    assert cpl_quantiles("cub") == (0.75, 0.99)
    assert cpl_quantiles("ucf101") == cpl_quantiles("cifar100") == (0.75, 0.95)
    assert cpl_step_quantile("cub") == 20 and cpl_step_quantile("dtd") == 10


# ---------------------------------------------------------------- CPL selection

SEL_PROBS = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.75, 0.25], [0.55, 0.45]])
SEL_CANDS = torch.tensor([[True, True], [True, True], [False, True], [False, False]])


def test_cpl_pools_defer_displaced_samples_to_their_next_candidate():
    # round 1: 0 and 1 propose to pool 0 (1 is surer, 0 is evicted); 2 fills pool 1 (uncertainty .75)
    # round 2: 0 proposes to pool 1 with uncertainty .6 < .75 and evicts 2, which has no candidate left
    assert cpl_assign(SEL_PROBS, SEL_CANDS, per_class=1).tolist() == [1, 0, -1, -1]
    indices, labels, cands, pools = cpl_select(SEL_PROBS, SEL_CANDS, per_class=1)
    assert indices.tolist() == [0, 1]
    assert labels.tolist() == [0, 0]  # argmax within the set: sample 0 is labelled 0 though it filled pool 1
    assert pools.tolist() == [1, 0]
    assert cands.tolist() == [[True, True], [True, True]]


def test_cpl_samples_propose_to_their_most_probable_candidate_first():
    assert cpl_assign(torch.tensor([[0.3, 0.7]]), torch.tensor([[True, True]]), per_class=1).tolist() == [1]
    # candidates with p < 1e-7 are never accepted
    assert cpl_assign(torch.tensor([[1.0, 0.0]]), torch.tensor([[False, True]]), per_class=1).tolist() == [-1]


def test_cpl_per_class_capacities_and_empty_sets():
    # pool 0 takes two, pool 1 none: sample 2 (only candidate 1) and sample 3 (empty set) are dropped
    assert cpl_assign(SEL_PROBS, SEL_CANDS, per_class=torch.tensor([2, 0])).tolist() == [0, 0, -1, -1]
    assert cpl_select(SEL_PROBS, SEL_CANDS, per_class=5)[0].tolist() == [0, 1, 2]


def test_cpl_full_pool_evicts_its_first_most_uncertain_slot():
    probs = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.9, 0.1]])
    cands = torch.tensor([[True, False], [True, False], [True, False]])
    # 0 and 1 fill the two slots with equal uncertainty; 2 replaces slot 0 (ClassPool's torch.max index)
    assert cpl_assign(probs, cands, per_class=2).tolist() == [-1, 0, 0]
    # an equally uncertain newcomer does not replace a member (strict comparison): 0 keeps the only slot
    assert cpl_assign(probs[:2], cands[:2], per_class=1).tolist() == [0, -1]
    # a replacement takes the evicted sample's slot: 2 enters slot 0 (evicting 0), ties 1 at .3, and 3
    # then evicts slot 0, i.e. 2, not 1
    probs = torch.tensor([[0.5, 0.5], [0.7, 0.3], [0.7, 0.3], [0.9, 0.1]])
    cands = torch.tensor([[True, False]] * 4)
    assert cpl_assign(probs, cands, per_class=2).tolist() == [-1, 0, -1, 0]


def test_cpl_with_argmax_singletons_matches_fpl_without_ties():
    probs = torch.tensor([
        [0.70, 0.20, 0.10],
        [0.80, 0.15, 0.05],
        [0.65, 0.25, 0.10],
        [0.10, 0.60, 0.30],
        [0.30, 0.25, 0.45],
        [0.20, 0.20, 0.60],
    ])
    singletons = F.one_hot(probs.argmax(dim=1), 3).bool()
    indices, labels, _, _ = cpl_select(probs, singletons, per_class=2)
    expected = fpl_select(probs, per_class=2)
    assert indices.tolist() == expected[0].tolist() == [0, 1, 3, 4, 5]
    assert labels.tolist() == expected[1].tolist()


def test_grip_schedule_and_pool_caps():
    assert [grip_per_class(1000, 10, t) for t in (0, 3, 9, 10)] == [10, 40, 100, 100]  # 100 more per 10%
    assert grip_per_class(105, 4, 0) == 2 and grip_per_class(105, 4, 1) == 5  # int(10 / 4), int(20 / 4)
    assert grip_per_class(105, 4, 0, step_quantile=20) == 5  # 5 iterations of int(105 / 5) = 21
    assert cpl_pool_caps(torch.zeros(3, dtype=torch.long), 16).tolist() == [16, 16, 16]
    # last fill [3, 16, 0], K_max 32: every pool grows by 32 - 16 = 16
    assert cpl_pool_caps(torch.tensor([3, 16, 0]), 32).tolist() == [19, 32, 16]
    with pytest.raises(ValueError):
        cpl_pool_caps(torch.tensor([20, 0]), 16)


def test_cpl_grip_pools_grow_per_refresh_from_the_previous_fill():
    # 40 samples, 2 classes: 30 of class 0 (p .9 down to .61), 10 of class 1 (p .7 up to .9)
    p0 = torch.cat([torch.linspace(0.9, 0.61, 30), torch.linspace(0.3, 0.1, 10)])
    probs = torch.stack([p0, 1 - p0], dim=1)
    labeller = CPL(quantiles=(0.5, 0.01), per_class="grip").bind("cifar10")
    assert labeller.step_quantile == 10
    first = labeller.select(probs, refresh_idx=0)  # K = int(1 * int(40 / 10) / 2) = 2 per pool
    assert first.indices.tolist() == [0, 1, 38, 39] and first.pools.tolist() == [0, 0, 1, 1]
    # refresh 2 (t = 2): K = int(3 * 4 / 2) = 6; both pools filled 2 last time, so each grows by 6 - 2 = 4
    third = labeller.select(probs, refresh_idx=2, previous=first)
    assert torch.bincount(third.pools).tolist() == [6, 6]
    # a pool that filled less grows by the same increment: last fill (2, 0) at K 6 gives caps (6, 4)
    lopsided = type(first)(first.indices[:2], first.labels[:2], first.mask[:2], first.pools[:2])
    assert labeller.pool_sizes(probs, 2, lopsided).tolist() == [6, 4]
    # where K stalls (here at 2, refresh 0 again) a pool still grows by 1: fill (2, 0) gives caps (2, 1)
    assert labeller.pool_sizes(probs, 0, lopsided).tolist() == [2, 1]
    assert cpl_pool_caps(torch.tensor([2, 0]), 2).tolist() == [2, 0]  # CPL's own rule: that pool stays empty
    # a previous selection with a pool above K (a fixed-K one) counts as none
    fixed = CPL(quantiles=(0.5, 0.01), per_class=16).bind("cifar10").select(probs)
    assert labeller.pool_sizes(probs, 0, fixed).tolist() == [2, 2]
    # K is at least 1 where the formula gives 0 (n / 10 < C), and a fixed K ignores the refresh
    assert labeller.pool_sizes(probs[:15], 0, None).tolist() == [1, 1]
    assert CPL(per_class=3).bind("cifar10").pool_sizes(probs, 5, first) == 3
    assert CPL(per_class="grip").bind("cub").step_quantile == 20


# ---------------------------------------------------------------- cc loss


def test_cc_loss_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    cands = torch.tensor([[False, True, True], [True, False, False]])
    e1, e2, e3 = math.exp(1), math.exp(2), math.exp(3)
    row0 = -math.log((e2 + e3) / (e1 + e2 + e3))  # 0.09431
    row1 = math.log(3)
    assert cc_loss(logits, cands).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    # the reference's formula, -log sum(softmax * y), on the same inputs
    reference = -torch.log((logits.softmax(dim=1) * cands.float()).sum(dim=1)).mean()
    assert cc_loss(logits, cands).item() == pytest.approx(reference.item(), rel=1e-6)


def test_cc_loss_with_singletons_is_cross_entropy():
    logits = torch.tensor([[0.3, -1.2, 2.0, 0.1], [1.5, 0.2, -0.7, 0.0], [-2.0, 3.0, 0.5, 1.0]])
    labels = torch.tensor([2, 0, 3])
    singletons = F.one_hot(labels, 4).bool()
    assert cc_loss(logits, singletons).item() == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)


def test_cc_loss_soft_weights_and_stability():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    p = logits.softmax(dim=1)[0]
    soft = torch.tensor([[0.0, 0.5, 0.5]])
    assert cc_loss(logits, soft).item() == pytest.approx(-math.log(0.5 * p[1] + 0.5 * p[2]), rel=1e-6)
    big = torch.tensor([[1000.0, 0.0, -1000.0]], requires_grad=True)
    loss = cc_loss(big, torch.tensor([[False, False, True]]))
    loss.backward()
    assert loss.item() == pytest.approx(2000.0)  # finite where softmax underflows to 0
    assert torch.isfinite(big.grad).all()


def test_cpl_labeller_selects_candidates_and_trains_with_cc():
    labeller = CPL(quantiles=(0.375, 0.75), per_class=16).bind("dtd")
    assert (labeller.alpha, labeller.beta) == (0.375, 0.75)
    assert (CPL().bind("resisc45").alpha, CPL().bind("resisc45").beta) == (0.90, 0.97)
    chosen = labeller.select(CPL_PROBS)
    assert chosen.indices.tolist() == [0, 1, 2, 3]  # row 4's set is empty
    assert chosen.labels.tolist() == [0, 0, 1, 2]
    assert chosen.mask.int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]]
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    loss, pos, neg = labeller.loss(logits, torch.tensor([1]), torch.tensor([[False, True, True]]), None)
    assert loss.item() == pytest.approx(cc_loss(logits, torch.tensor([[False, True, True]])).item())
    assert neg.item() == 0
