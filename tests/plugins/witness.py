"""FedUR with a server that reports whose uploads it aggregated: what the tests of lost and late uploads read
(tests/test_system.py). Its metrics: "uploads", how many clients the round's ServerRound holds, and "who", their ids
as a bit mask (sum of 2^k).

    python fedur/main.py --config configs/tiny.yaml --method tests.plugins.witness.Witness --clock.drop_rate 0.5
"""

from __future__ import annotations

from fedur.methods import Aggregated, FedUR, ServerRound


class Witness(FedUR):
    def aggregate(self, round: ServerRound) -> Aggregated:
        out = super().aggregate(round)
        who = sum(2 ** k for k in round.participants.nonzero().flatten().tolist())
        return Aggregated(out.shared, out.state, {**out.metrics, "uploads": int(round.participants.sum()), "who": who})
