"""Benchmarks for pm_vector: retrieval metrics (:mod:`pm_vector.bench.metrics`) and baseline
retrieval methods (:mod:`pm_vector.bench.baselines`) that PrivateMail is compared against, and the
programs that drive the real client against the real service (``pm-vector demo``:
:mod:`pm_vector.bench.demo`; ``bench load``: :mod:`pm_vector.bench.loadtest`). This package sits
above both the client and the server: neither imports it."""
