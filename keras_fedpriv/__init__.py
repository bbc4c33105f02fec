"""keras-fedpriv: Keras layers, optimizer wrappers and callbacks for private federated learning.

Quick start::

    from keras_fedpriv import LabelDPLayer, EmbeddingDPLayer, privatize_labels
    from keras_fedpriv import VerticalModel, VAEBottom
    from keras_fedpriv.attacks import norm_label_inference
    from keras_fedpriv.privacy import deldp
    from keras_fedpriv import HorizontalFL, MagRR, SignDS, SignDSEncoder

Names are imported on first use (``import keras_fedpriv`` alone imports no
TensorFlow). Keras still finds the package's layers, optimizers and callbacks
in a saved model: their modules are imported as soon as Keras is (so
``import keras_fedpriv`` then ``keras.models.load_model(...)`` works). The one
import mechanism behind both is explained in ``keras_fedpriv/_lazy.py``.
"""

from keras_fedpriv._lazy import lazy_exports

__version__ = "0.1.0"

_SUBMODULES = ("attacks", "callbacks", "datasets", "federated", "mechanisms", "optimizers",
               "privacy")
#: exported name -> the module that defines it
_EXPORTS = {
    "EmbeddingDPLayer": "keras_fedpriv.layers",
    "HorizontalFL": "keras_fedpriv.federated",
    "LabelDPLayer": "keras_fedpriv.layers",
    "MagRR": "keras_fedpriv.callbacks",
    "SignDS": "keras_fedpriv.optimizers",
    "SignDSEncoder": "keras_fedpriv.optimizers",
    "VAEBottom": "keras_fedpriv.layers",
    "VerticalModel": "keras_fedpriv.federated",
    "logger": "keras_fedpriv.logs",
    "privatize_dataset": "keras_fedpriv.privatize",
    "privatize_labels": "keras_fedpriv.privatize",
    "set_verbosity": "keras_fedpriv.logs",
}
#: the modules that register Keras objects (``keras.saving.register_keras_serializable``):
#: imported as soon as Keras is, so that Keras finds them in a saved model
_KERAS_OBJECTS = (
    "keras_fedpriv.layers.embedding_dp",
    "keras_fedpriv.layers.label_dp",
    "keras_fedpriv.layers.vae_bottom",
    "keras_fedpriv.optimizers.signds_optimizer",
    "keras_fedpriv.federated.laplace_eval",
    "keras_fedpriv.federated.magrr",
    "keras_fedpriv.federated.vertical.model",
    "keras_fedpriv.wide_deep",
)
lazy_exports(__name__, _EXPORTS, _SUBMODULES, keras_objects=_KERAS_OBJECTS)

__all__ = sorted(_EXPORTS) + list(_SUBMODULES) + ["__version__"]
