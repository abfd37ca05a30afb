"""The core of Search-R1 on PyTRIO, readable top to bottom in one sitting.

Read it in the order of the one list in CONTRIBUTING.md, "Reading the core": the reference (one
whole step written plainly, the algorithm the rest is held to), then the data types, the tools,
the protocol, the rollout, and the step's pieces in the order it runs them (reward, advantage,
datum, kl, objective, update) up to the trainer.

The core imports only itself, the standard library, numpy, pytrio and the tokenizer libraries
(tests/core/test_core_imports.py holds it to that); what it needs from the run around it (where
batches come from, the micro-batching, the base model's logprobs) it is given.
"""
