"""pm_vector: differentially private nearest-neighbour search in PostgreSQL/pgvector.

Subpackages, one concern each:

- :mod:`pm_vector.privacy`   noise mechanisms, sensitivity bounds, accountant, CSPRNG
- :mod:`pm_vector.manifold`  graph Laplacians and the SMLQ embedder
- :mod:`pm_vector.alignment` Kabsch-Umeyama similarity alignment
- :mod:`pm_vector.client`    the client side of PrivateMail (request building)
- :mod:`pm_vector.bench`     baselines, metrics and benchmarks
- :mod:`pm_vector.cli`       the ``pm-vector`` command line
"""

__version__ = "0.2.0"
