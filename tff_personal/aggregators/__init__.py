"""Aggregation factories usable by every algorithm (robust statistics, clipping)."""
