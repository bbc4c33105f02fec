"""keras-fedpriv on Flower: vertical FL with LabelDP (leader) and EmbeddingDP (followers)."""

# Every process of the app (the leader's ServerApp, each follower's ClientApp) imports this
# package first: TensorFlow's start-up logs stay hidden there (KERAS_FEDPRIV_TF_LOGS=1: shown).
from keras_fedpriv.logs import quiet_tensorflow

quiet_tensorflow()
