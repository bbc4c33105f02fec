"""Privacy estimates and reports.

* `privacy_report` / `PrivacyReport`: collect the DpEvents of every mechanism
  of a model or run and compose them with dp-accounting (PLD or RDP);
  `EpsilonLogger` logs the composed eps into the training history.
* `deldp` / `DELDPReport`: the dELDP estimate of a VAE bottom (seed 002,
  Theorem 2), an empirical estimate over given samples, not a DP guarantee.
"""

from keras_fedpriv.privacy.deldp import DELDPReport, deldp, max_pairwise_distance
from keras_fedpriv.privacy.report import (
    EpsilonLogger,
    PrivacyReport,
    Release,
    compose_epsilon,
    privacy_report,
    pure_epsilon,
)

__all__ = ["DELDPReport", "EpsilonLogger", "PrivacyReport", "Release", "compose_epsilon", "deldp",
           "max_pairwise_distance", "privacy_report", "pure_epsilon"]
