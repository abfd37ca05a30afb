"""Views of runs: transcripts in the terminal and as HTML, and plots."""
