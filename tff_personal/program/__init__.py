"""The training program: sampling, evaluation, checkpoints and outputs."""
