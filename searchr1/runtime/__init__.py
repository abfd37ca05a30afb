"""The runtime around the core: tokenizer, PyTRIO connection, preflight, services."""
