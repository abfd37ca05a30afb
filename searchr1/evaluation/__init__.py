"""Evaluation: the eval loop, its metrics and the published rows."""
