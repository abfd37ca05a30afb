"""Evaluation: the eval loop, its metrics, the published rows, and the transcripts of a run."""
