"""The core of Search-R1 on PyTRIO, readable top to bottom in one sitting.

protocol (the search tool, rendering, parsing, token stitching) -> rollout (one state machine
per trajectory) -> reward -> advantage (group-relative) -> datum (one PyTRIO Datum per
trajectory) -> packing (micro-batches, n_k/N) -> trainer (the loop) -> update (one
forward_backward and optim_step). What they share: trajectory (what a rollout records),
train_config (a run's settings), pipeline and off_policy (which weights sample which batch),
loss_options, kl and dynamic_sampling (the algorithm options), metrics, diagnostics and health
(what every step reports and the collapse guard), failures and reporting.

Nothing here imports the offline twin, the benchmarks, the commands or a search transport
(tests/core/test_core_imports.py holds it to that).
"""
