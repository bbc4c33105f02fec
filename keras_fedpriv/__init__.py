"""keras-fedpriv: Keras layers, optimizer wrappers and callbacks for private federated learning.

Quick start::

    from keras_fedpriv import LabelDPLayer, EmbeddingDPLayer, privatize_labels
    from keras_fedpriv import VerticalModel, VAEBottom
    from keras_fedpriv.attacks import norm_label_inference
    from keras_fedpriv.privacy import deldp
"""

__version__ = "0.1.0"

from keras_fedpriv import attacks, federated, mechanisms, privacy  # noqa: E402
from keras_fedpriv.federated import VerticalModel  # noqa: E402
from keras_fedpriv.layers import EmbeddingDPLayer, LabelDPLayer, VAEBottom  # noqa: E402
from keras_fedpriv.privatize import privatize_dataset, privatize_labels  # noqa: E402

__all__ = ["EmbeddingDPLayer", "LabelDPLayer", "VAEBottom", "VerticalModel", "attacks",
           "federated", "mechanisms", "privacy", "privatize_dataset", "privatize_labels",
           "__version__"]
