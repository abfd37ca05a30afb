"""The offline twin of PyTRIO: everything that exists only so that the project can run and be
verified without a key or a network. The core (protocol, rollout, reward, advantage, datum,
packing, trainer) never imports from here; commands reach it through ``searchr1.services``.
"""
