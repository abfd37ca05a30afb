"""Run directories, loggers, progress, usage, prices and estimates."""
