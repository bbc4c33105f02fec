"""A seeded horizontal-FL Flower app for the tests (seeds only make runs comparable)."""
