"""Privacy estimates and reports.

* `privacy_report` / `PrivacyReport`: collect the DpEvents of every mechanism
  of a model or run and compose them with dp-accounting (PLD or RDP);
  `EpsilonLogger` logs the composed eps into the training history.
* `audit` and one auditor per mechanism (`audit_binary_rr`, ...,
  `audit_signds`): empirical lower bounds on eps with Clopper-Pearson
  confidence (docs/audit.md).
* `deldp` / `DELDPReport`: the dELDP estimate of a VAE bottom (seed 002,
  Theorem 2), an empirical estimate over given samples, not a DP guarantee.
"""

from keras_fedpriv.privacy.audit import (
    AuditResult,
    audit,
    audit_binary_rr,
    audit_embedding_dp_layer,
    audit_kary_rr,
    audit_label_dp_layer,
    audit_laplace,
    audit_magrr,
    audit_quantize_rr,
    audit_signds,
    clopper_pearson,
    eps_lower_bound,
)
from keras_fedpriv.privacy.deldp import DELDPReport, deldp, max_pairwise_distance
from keras_fedpriv.privacy.report import (
    EpsilonLogger,
    PrivacyReport,
    Release,
    compose_epsilon,
    privacy_report,
    pure_epsilon,
)

__all__ = ["AuditResult", "audit", "audit_binary_rr", "audit_embedding_dp_layer", "audit_kary_rr",
           "audit_label_dp_layer", "audit_laplace", "audit_magrr", "audit_quantize_rr",
           "audit_signds", "clopper_pearson", "eps_lower_bound",
           "DELDPReport", "EpsilonLogger", "PrivacyReport", "Release", "compose_epsilon", "deldp",
           "max_pairwise_distance", "privacy_report", "pure_epsilon"]
