"""Keras callbacks for federated training.

Both are protocol objects that live with their protocol in
`keras_fedpriv.federated` (a client side that releases, a server side that
estimates); as callbacks they plug into ``HorizontalFL.fit`` and
``model.fit``, and the federated drivers run their rounds.

* `MagRR`: server-side estimation of the global step size of sign-based
  (SignDS) client updates from one randomized-response bit per client and
  round (MindSpore Federated's SignDS design).
* `LaplaceEvaluation`: clustering scores (silhouette, Calinski-Harabasz,
  Davies-Bouldin) of the model's softmax outputs, which the clients release
  under Laplace local DP after every epoch or federated round (MindSpore Federated's
  design).
"""

from keras_fedpriv.federated.laplace_eval import LaplaceEvaluation
from keras_fedpriv.federated.magrr import MagRR

__all__ = ["LaplaceEvaluation", "MagRR"]
