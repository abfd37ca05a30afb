"""The runtime around the core: tokenizer, PyTRIO connection, preflight, what our servers share."""
