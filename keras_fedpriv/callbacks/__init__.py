"""Keras callbacks for federated training.

* `MagRR`: server-side estimation of the global step size of sign-based
  (SignDS) client updates from one randomized-response bit per client and
  round (seed 003, ALGORITHMS.md section 5).
"""

from keras_fedpriv.callbacks.magrr import MagRR

__all__ = ["MagRR"]
