"""keras-fedpriv: Keras layers, optimizer wrappers and callbacks for private federated learning.

Quick start::

    from keras_fedpriv import LabelDPLayer, EmbeddingDPLayer, privatize_labels
"""

__version__ = "0.1.0"

from keras_fedpriv import mechanisms  # noqa: E402
from keras_fedpriv.layers import EmbeddingDPLayer, LabelDPLayer  # noqa: E402
from keras_fedpriv.privatize import privatize_dataset, privatize_labels  # noqa: E402

__all__ = ["EmbeddingDPLayer", "LabelDPLayer", "mechanisms", "privatize_dataset",
           "privatize_labels", "__version__"]
