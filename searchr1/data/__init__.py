"""Datasets: the JSONL example files and their preparation."""
