"""Benchmarks of tianji on the machine at hand (``tianji bench ...``).

* :mod:`tianji.bench.transport` - ``tianji bench transport``: throughput of the transports
  against the machine's ceilings (:mod:`tianji.bench.ceilings`), and wake-up latency.
* :mod:`tianji.bench.peer` - the receiving process of the two-process measurements,
  started and stopped by :mod:`tianji.bench.spawn`.
* :mod:`tianji.bench.measure` - pure helpers shared by both ends (windows, percentiles).
* :mod:`tianji.bench.report` - rows, goals, the table and the JSON document (pure).
"""
