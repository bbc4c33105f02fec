"""Privacy estimates and reports.

* `privacy_report` / `PrivacyReport`: compose the release ledgers of every
  protection reachable from a model, History, optimizer or run with
  dp-accounting (PLD via `MixedPLDAccountant`, or RDP), for the worst unit;
  `EpsilonLogger` logs the composed eps into the training history.
* `PrivacyBudget`: a party's own cap on its composed eps over this run and
  past ones (a ledger file on its machine); `BudgetExhausted` when a
  release would go over it.
* `plan_epsilon` / `plan_noise_multiplier`: the per-release eps or noise
  that meets a target (eps, delta) for a planned number of releases;
  `plan_mechanism` (0.1's `plan_run`) gives one mechanism's `Plan`, which
  names the release pattern it assumes and checks the run against it
  (`Plan.check`, the `PlanCheck` callback).
* `plan`: a whole run (SignDS or Gaussian uploads, MagRR, Laplace
  evaluations; labels and features) and one target: every mechanism's
  per-release setting, each secret within the target (`RunPlan`), and
  `TooSmallToLearnWarning` where a setting is too small to learn.
* `audit` and one auditor per mechanism (`audit_binary_rr`, ...,
  `audit_signds`): empirical lower bounds on eps with Clopper-Pearson
  confidence (docs/audit.md).
* `deldp` / `DELDPReport`: the dELDP estimate of a VAE bottom (Theorem 2 of
  "Exploiting Internal Randomness for Privacy in Vertical Federated Learning", ESORICS 2024), an
  empirical estimate over given samples, not a DP guarantee.
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
from keras_fedpriv.privacy.budget import BudgetExhausted, PrivacyBudget
from keras_fedpriv.privacy.deldp import DELDPReport, deldp, max_pairwise_distance
from keras_fedpriv.privacy.accountant import MixedPLDAccountant
from keras_fedpriv.privacy.planning import (
    Plan,
    PlanCheck,
    PlanExceeded,
    PlanMismatchWarning,
    plan_epsilon,
    plan_mechanism,
    plan_noise_multiplier,
    plan_run,
    planned_epsilon,
)
from keras_fedpriv.privacy.run_plan import MechanismPlan, RunPlan, TooSmallToLearnWarning, plan
from keras_fedpriv.privacy.report import (
    EpsilonLogger,
    PrivacyReport,
    Release,
    compose_epsilon,
    find_protections,
    privacy_ledger,
    privacy_report,
    pure_epsilon,
)

__all__ = ["AuditResult", "audit", "audit_binary_rr", "audit_embedding_dp_layer", "audit_kary_rr",
           "audit_label_dp_layer", "audit_laplace", "audit_magrr", "audit_quantize_rr",
           "audit_signds", "clopper_pearson", "eps_lower_bound", "BudgetExhausted",
           "PrivacyBudget",
           "DELDPReport", "EpsilonLogger", "MixedPLDAccountant", "PrivacyReport", "Release",
           "compose_epsilon", "deldp", "find_protections", "max_pairwise_distance",
           "MechanismPlan", "Plan", "PlanCheck", "PlanExceeded", "PlanMismatchWarning",
           "plan_epsilon", "plan", "plan_mechanism", "plan_noise_multiplier", "plan_run",
           "planned_epsilon", "privacy_ledger", "privacy_report", "pure_epsilon", "RunPlan",
           "TooSmallToLearnWarning"]
