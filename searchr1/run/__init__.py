"""Run directories, files, transcripts, loggers and progress."""
