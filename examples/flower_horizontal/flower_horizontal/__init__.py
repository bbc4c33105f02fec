"""keras-fedpriv on Flower: horizontal FL with SignDS uploads and MagRR."""
