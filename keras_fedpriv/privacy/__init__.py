"""Privacy estimates and reports.

* `deldp` / `DELDPReport`: the dELDP estimate of a VAE bottom (seed 002,
  Theorem 2), an empirical estimate over given samples, not a DP guarantee.
"""

from keras_fedpriv.privacy.deldp import DELDPReport, deldp, max_pairwise_distance

__all__ = ["DELDPReport", "deldp", "max_pairwise_distance"]
