"""Taking a trained checkpoint home: safe archive extraction and PEFT LoRA adapter checks."""
