"""The tool observation, the environment's part of a trajectory: how a search result becomes the
tool message's text (:mod:`.text`), how much of it fits the trajectory's budgets (:mod:`.fit`),
and how the tries are sized without tokenising the same item again and again (:mod:`.piecewise`).
Its tokens are stitched into the trajectory by :mod:`searchr1.core.protocol`."""
