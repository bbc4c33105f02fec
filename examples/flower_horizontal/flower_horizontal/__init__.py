"""keras-fedpriv on Flower: horizontal FL with SignDS uploads and MagRR."""

# Flower imports this package first in every process that runs the app (the ServerApp's, each
# ClientApp's): hide TensorFlow's start-up logs there before any module of the app imports it
# (KERAS_FEDPRIV_TF_LOGS=1 shows them). A Simulation Engine worker imports TensorFlow earlier.
from keras_fedpriv.logs import quiet_tensorflow

quiet_tensorflow()
