"""The names of the aggregators (no TensorFlow import: flags use them)."""

AGGREGATOR_NAMES = (
    'mean', 'median', 'trimmed_mean', 'krum', 'multi_krum', 'k_norm', 'norm_clip', 'tff_robust'
)
