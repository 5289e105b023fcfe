"""Benchmarks of tianji on the machine at hand (``tianji bench ...``): what a user runs to
measure tianji alone, with nothing but tianji installed.

* :mod:`tianji.bench.transport` - ``tianji bench transport``: throughput of the transports
  against the machine's ceilings (:mod:`tianji.bench.ceilings`), and wake-up latency.
* :mod:`tianji.bench.peer` - the receiving process of the two-process measurements,
  started and stopped by :mod:`tianji.bench.spawn`.
* :mod:`tianji.bench.measure` - pure helpers shared by both ends (windows, percentiles).
* :mod:`tianji.bench.report` - rows, goals, the table and the JSON document (pure).
* ``train``, ``throughput``, ``scale``, ``lag``, ``memory``, ``chaos`` - the other
  ``tianji bench`` commands (a module per command, with its report module).

The peers' runners (Stable-Baselines3, Sample Factory) and the network-namespace hosts
(root) are scripts in the checkout's ``benchmarks/`` (``peers.py``, ``hosts.py``), which add
them to these commands through their parameters (:class:`tianji.bench.train.Peer`,
:data:`tianji.bench.throughput.PeerCommand`, :class:`tianji.bench.scale_fanout.Hosts`,
:data:`tianji.bench.chaos_run.StartHosts`).
"""
