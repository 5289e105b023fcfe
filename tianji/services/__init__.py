"""The services: actor, buffer, learner, params, inference, allreduce, monitor, balancer
(one file each).

Each is a thin :class:`~tianji.runtime.service.Service` shell around pure RL logic (an
algorithm from :mod:`tianji.algorithms`, a buffer from :mod:`tianji.rl.buffers`, the
balance policy of :mod:`tianji.rl.balance`); they talk only through the events of
:mod:`tianji.rl.events` on the topics of :mod:`tianji.rl.topics`.
"""
