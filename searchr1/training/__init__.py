"""Training around the core step: the off-policy pipeline, dynamic sampling, manual packing."""
