"""Encoding: image decode and preprocessing, model loading, the encoder actor."""
