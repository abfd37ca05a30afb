"""Run health: per-step metrics, policy diagnostics and the collapse rules."""
