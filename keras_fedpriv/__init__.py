"""keras-fedpriv: Keras layers, optimizer wrappers and callbacks for private federated learning.

Quick start::

    from keras_fedpriv import LabelDPLayer, EmbeddingDPLayer, privatize_labels
    from keras_fedpriv import VerticalModel, VAEBottom
    from keras_fedpriv.attacks import norm_label_inference
    from keras_fedpriv.privacy import deldp
    from keras_fedpriv import HorizontalFL, MagRR, SignDS, SignDSEncoder
"""

__version__ = "0.1.0"

from keras_fedpriv import (  # noqa: E402
    attacks,
    callbacks,
    datasets,
    federated,
    mechanisms,
    optimizers,
    privacy,
)
from keras_fedpriv.callbacks import MagRR  # noqa: E402
from keras_fedpriv.federated import HorizontalFL, VerticalModel  # noqa: E402
from keras_fedpriv.optimizers import SignDS, SignDSEncoder  # noqa: E402
from keras_fedpriv.layers import EmbeddingDPLayer, LabelDPLayer, VAEBottom  # noqa: E402
from keras_fedpriv.privatize import privatize_dataset, privatize_labels  # noqa: E402
from keras_fedpriv.logs import logger, set_verbosity  # noqa: E402

__all__ = ["EmbeddingDPLayer", "HorizontalFL", "LabelDPLayer", "MagRR", "SignDS",
           "SignDSEncoder", "VAEBottom", "VerticalModel", "attacks", "callbacks", "datasets",
           "federated",
           "logger", "mechanisms", "optimizers", "privacy", "privatize_dataset",
           "privatize_labels", "set_verbosity",
           "__version__"]
