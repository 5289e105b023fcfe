"""The equal-work settings of ``tianji bench throughput``: one spec per env, and what it
means for each system, written side by side so the two translations can be read together.

An equal-work pair is one tianji cell and one Sample Factory run that do the same work per
sample: the same network (layers, widths, activation, separate or shared actor and critic),
the same rollout length, batch, minibatches and epochs, the same running normalizations,
the same learner torch threads and the same processes (2 env processes of 4 envs, one
inference process, one learner), both overlapping collection with learning, and both
counted by what their learner consumed. What stays each system's own is how it schedules
that work: tianji's controller (``relaxed``, ``lag_target = 1``) against SF's ``async_rl``
with ``num_batches_to_accumulate = 2``, SF's double-buffered env groups
(``worker_num_splits``, 2 by default, 1 in its Atari example) against tianji's one group
(``splits = 1``), and the optimizer details that cost nothing measurable (value clipping,
minibatch shuffling, learning-rate schedule, reward scale).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["EQUAL", "EqualWork", "sf_flags", "tianji_overrides"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EqualWork:
    """The work both systems do in an equal-work pair."""

    torso: str
    """"mlp" (``hidden`` layers, ``activation`` after each) or "nature" (the Nature-DQN
    CNN: convs 32x8/4, 64x4/2, 64x3/1, then ``fc`` units, ReLU throughout; one torso
    shared by the two linear heads)."""
    hidden: tuple[int, ...] = ()
    """MLP hidden layer sizes (``torso = "mlp"``)."""
    fc: int = 512
    """The CNN's fully connected layer (``torso = "nature"``; tianji's ``NatureCNN.features``)."""
    activation: str = "tanh"
    """tianji's MLPs use tanh and its CNN ReLU (neither is configurable): SF is set to match."""
    shared: bool = False
    """One torso for actor and critic (two heads) instead of two separate networks."""
    rollout: int
    """Steps per env per fragment (tianji ``fragment_length``, SF ``rollout``)."""
    minibatch: int
    """Samples per gradient step (SF calls it ``batch_size``)."""
    minibatches: int
    """Gradient steps per epoch (SF ``num_batches_per_epoch``)."""
    epochs: int
    """Passes over each batch of ``minibatch x minibatches`` samples."""
    normalize_obs: bool
    """Running mean/std at the network's input (SF ``normalize_input``)."""
    normalize_returns: bool
    """Value targets in running-std units (SF ``normalize_returns``)."""
    learner_threads: int = 1
    """torch intra-op threads of the learner: SF 2.1.1's learner always runs with 1."""
    inference_processes: int = 1
    """Processes that run the actors' forward passes (SF has no in-worker inference, so
    tianji runs an inference service: ``[inference] count``)."""

    @property
    def batch(self) -> int:
        """Samples per learner update."""
        return self.minibatch * self.minibatches


EQUAL: dict[str, EqualWork] = {
    # tianji's CartPole example (examples/cartpole_ppo.toml): 64x64 tanh actor and critic,
    # 512-sample batches of 2 x 256, 5 epochs, no normalizations
    "cartpole": EqualWork(
        torso="mlp",
        hidden=(64, 64),
        activation="tanh",
        rollout=64,
        minibatch=256,
        minibatches=2,
        epochs=5,
        normalize_obs=False,
        normalize_returns=False,
    ),
    # SF's Atari example and tianji's examples/pong_ppo.toml agree: 1,024-sample batches of
    # 4 x 256, 4 epochs, rollout 128, both normalizations, the Nature CNN
    "pong": EqualWork(
        torso="nature",
        fc=512,
        activation="relu",
        shared=True,
        rollout=128,
        minibatch=256,
        minibatches=4,
        epochs=4,
        normalize_obs=True,
        normalize_returns=True,
    ),
}


def tianji_overrides(work: EqualWork, envs_per_actor: int) -> dict[str, dict[str, Any]]:
    """The run-config sections (section -> settings) that make a tianji cell do ``work``.

    Raises:
        ValueError: if a batch is not a whole number of fragments.
    """
    fragments, rest = divmod(work.batch, work.rollout * envs_per_actor)
    if rest or not fragments:
        raise ValueError(
            f"a batch of {work.batch} is not a whole number of {work.rollout} x "
            f"{envs_per_actor}-env fragments"
        )
    algo: dict[str, Any] = {
        "torso": work.torso,
        "fragments_per_batch": fragments,
        "update_epochs": work.epochs,
        "num_minibatches": work.minibatches,
        "normalize_obs": work.normalize_obs,
        "normalize_returns": work.normalize_returns,
    }
    if work.torso == "mlp":
        algo |= {"hidden": list(work.hidden), "shared_network": work.shared}
    return {
        "algo": algo,
        "actors": {"fragment_length": work.rollout, "inference": "service", "splits": 1},
        "inference": {"count": work.inference_processes},
        "learner": {"torch_threads": work.learner_threads},
    }


def sf_flags(work: EqualWork) -> list[str]:
    """Sample Factory 2.1.1 flags that make its APPO do ``work`` (after its example's)."""
    if work.torso == "mlp":
        net = ["--encoder_mlp_layers", *map(str, work.hidden)]
    else:
        net = [
            "--encoder_conv_architecture=convnet_atari",
            "--encoder_conv_mlp_layers",
            str(work.fc),
        ]
    if work.learner_threads != 1:
        raise ValueError(f"learner_threads={work.learner_threads}: SF 2.1.1's learner runs 1")
    return [
        *net,
        f"--nonlinearity={work.activation}",
        f"--actor_critic_share_weights={work.shared}",
        "--use_rnn=False",
        f"--rollout={work.rollout}",
        f"--batch_size={work.minibatch}",
        f"--num_batches_per_epoch={work.minibatches}",
        f"--num_epochs={work.epochs}",
        f"--normalize_input={work.normalize_obs}",
        f"--normalize_returns={work.normalize_returns}",
        "--async_rl=True",
        f"--policy_workers_per_policy={work.inference_processes}",
    ]
