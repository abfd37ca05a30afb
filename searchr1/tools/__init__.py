"""Developer tools: golden trajectories and the loss-reduction probe."""
