"""Keras callbacks for federated training.

* `MagRR`: server-side estimation of the global step size of sign-based
  (SignDS) client updates from one randomized-response bit per client and
  round (MindSpore Federated's SignDS design).
* `LaplaceEvaluation`: clustering scores (silhouette, Calinski-Harabasz,
  Davies-Bouldin) of the model's softmax outputs, which the clients release
  under Laplace local DP after every epoch or federated round (MindSpore Federated's
  design).
"""

from keras_fedpriv.callbacks.laplace_eval import LaplaceEvaluation
from keras_fedpriv.callbacks.magrr import MagRR

__all__ = ["LaplaceEvaluation", "MagRR"]
