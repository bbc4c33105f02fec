"""keras-fedpriv: Keras layers, optimizer wrappers and callbacks for private federated learning."""

__version__ = "0.1.0"
