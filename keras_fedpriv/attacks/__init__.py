"""Attacks that measure how much a federated protocol leaks.

* `norm_label_inference`, `direction_label_inference`: a follower infers the
  leader's binary labels from the cut-layer gradients it receives (Li et al.,
  ICLR 2022); metric: ROC-AUC (0.5 = chance).
* `feature_reconstruction`: the leader trains an inverse decoder from
  embeddings to the follower's features on auxiliary rows; metric: MSE
  relative to predicting the mean (1.0 = nothing learned).
* `gradient_inversion` (DLG / iDLG, horizontal FL): the server reconstructs a
  client's training examples from its uploaded update; metric: MSE relative to
  predicting the mean, after matching (docs/results/gradient_inversion.md).
* `model_completion` (Fu et al., USENIX Security 2022): a follower that knows a
  few labels fits a top model on its own embeddings and labels every other
  example; metric: ROC-AUC and accuracy on the rows it did not know.
* `embedding_clustering`: k-means on the embeddings, clusters named by a few
  known labels or the minority prior; same metrics.

All take plain (N, d) numpy arrays or tensors of the Keras backend; see docs/attacks.md.
"""

from keras_fedpriv.attacks.embedding_clustering import embedding_clustering  # noqa: F401
from keras_fedpriv.attacks.feature_reconstruction import (  # noqa: F401
    ReconstructionResult,
    feature_reconstruction,
)
from keras_fedpriv.attacks.gradient_inversion import (  # noqa: F401
    InversionResult,
    gradient_inversion,
    infer_label_idlg,
)
from keras_fedpriv.attacks.known_labels import (  # noqa: F401
    LabelInferenceResult,
    choose_known_rows,
)
from keras_fedpriv.attacks.label_inference import (  # noqa: F401
    AttackResult,
    direction_label_inference,
    norm_label_inference,
)
from keras_fedpriv.attacks.model_completion import model_completion  # noqa: F401

__all__ = ["AttackResult", "InversionResult", "LabelInferenceResult", "ReconstructionResult",
           "choose_known_rows", "direction_label_inference", "embedding_clustering",
           "feature_reconstruction", "gradient_inversion", "infer_label_idlg",
           "model_completion", "norm_label_inference"]
