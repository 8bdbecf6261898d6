"""Reports of finished runs: figures, markdown and CSV files (no TensorFlow)."""
