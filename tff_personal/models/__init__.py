"""Keras model builders with named blocks (the unit FedPer personalizes)."""
