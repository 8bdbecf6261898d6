"""Per-client evaluation and the fairness summaries of its results."""
