"""``python cli.py bench``: how much faster and cheaper than the lab port's way, measured side by side.

Five figures, each a ratio of two things measured in the same run (so they hold on a noisy,
shared machine):

1. :mod:`.scheduling`: rollout makespan against its lower bound, ours and lock-step rounds
   (the lab port's policy, :mod:`.lockstep`), sampling from the offline twin (:mod:`.served`) with
   modelled latencies.
2. :mod:`.protocol_cpu`: chat-template renders and CPU per tool turn, ours against the lab port's
   four renders per candidate item.
3. :mod:`.packing`: micro-batches against their lower bound, padded against real tokens.
4. :mod:`.search_calls`: search requests saved by single-flight and the query cache.
5. :mod:`.step_overhead`: the local CPU of one offline training step, by phase, ours against the
   same step with the lab port's observation fitting.

:mod:`.report` prints the table and writes ``bench.json``. Not part of pytest (only a smoke
test of the structure, ``tests/bench/test_bench.py``).
"""
