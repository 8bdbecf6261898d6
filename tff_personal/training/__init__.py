"""Client-side training steps in TensorFlow, shared by the algorithms and the evaluation."""
