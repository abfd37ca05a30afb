"""Small helpers every layer above the core shares, each importing only the standard library, the
core and one another: counted nouns (wording), safe file writes (fileio), the one JSON reader
(jsonl), text checks (unicode), printed command lines (invocation) and the masking of secrets
(secrets)."""
