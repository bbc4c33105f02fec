"""keras-fedpriv on Flower: vertical FL with LabelDP (leader) and EmbeddingDP (followers)."""
