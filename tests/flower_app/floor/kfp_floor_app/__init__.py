"""An empty Flower app: Flower's own cost per round (bench/flower.py)."""
