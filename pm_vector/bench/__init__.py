"""Benchmarks for pm_vector: retrieval metrics (:mod:`pm_vector.bench.metrics`) and baseline
retrieval methods (:mod:`pm_vector.bench.baselines`) that PrivateMail is compared against."""
