"""The core of Search-R1 on PyTRIO, readable top to bottom in one sitting.

Start with reference (one whole step written plainly, the algorithm the rest is held to), then
the production pieces in the order a step runs them: types (the question, the search result,
the budgets, the turn and the trajectory of turns) -> protocol (what the model is told, how its
turns are parsed, how tokens are stitched) -> rollout (one state machine per trajectory;
observation/ fits each search result into the budget) -> reward -> advantage (group-relative,
carried by every turn) -> datum (one PyTRIO Datum per context of a trajectory) -> kl (the
optional penalty) -> objective (each loss's per-token term) -> update (forward_backward,
optim_step) -> trainer (one step in that order); config and settings declare a run's settings.

The core imports only itself, the standard library, numpy, pytrio and the tokenizer libraries
(tests/core/test_core_imports.py holds it to that); what it needs from the run around it (where
batches come from, the micro-batching, the base model's logprobs) it is given.
"""
