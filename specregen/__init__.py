"""specregen: token-exact regeneration of draft-model training data."""

__version__ = "0.1.0"
