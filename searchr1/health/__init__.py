"""Run health: policy diagnostics and the collapse rules."""
