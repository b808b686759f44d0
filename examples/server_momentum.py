"""FedUR with server momentum (FedAvgM, Hsu, Qi and Brown 2019, "Measuring the effects of non-identical data
distribution for federated visual classification"): the server treats the change of each shared piece as
a pseudo-gradient and steps along its momentum, and reports the momentum's norm every round. A method of a
user's own, outside fedur:

    PYTHONPATH=. python fedur/main.py --config configs/smoke.yaml --method examples.server_momentum.ServerMomentum \\
        --method.momentum 0.5
"""

from __future__ import annotations

import torch

from fedur.methods import Aggregated, FedUR, ServerRound


class ServerMomentum(FedUR):
    """FedUR whose server steps each shared piece along the momentum of its averaged updates."""

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9, share: str = "visual", **kwargs) -> None:
        """
        Args:
            server_lr: Server learning rate: the step along the momentum (1 with momentum 0 is FedAvg).
            momentum: Server momentum beta: v <- beta * v + (global - average).
            share: The prompts the server averages (FedUR's share setting).
        """
        super().__init__(share, **kwargs)  # weighting: documented by Method
        self.server_lr, self.momentum = float(server_lr), float(momentum)

    def aggregate(self, round: ServerRound) -> Aggregated:
        averaged = super().aggregate(round).shared  # FedAvg: the weighted average
        shared, state, metrics = {}, {}, {}
        for name, average in averaged.items():
            delta = round.current[name] - average  # (*shape) the round's pseudo-gradient
            velocity = self.momentum * round.state.get(f"velocity_{name}", torch.zeros_like(delta)) + delta
            state[f"velocity_{name}"] = velocity  # kept between rounds and checkpointed with the server
            shared[name] = round.current[name] - self.server_lr * velocity
            metrics[f"velocity_norm_{name}"] = velocity.norm()
        return Aggregated(shared, state, metrics)
