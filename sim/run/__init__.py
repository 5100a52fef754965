"""Run-level layers above one simulated step (failures, checkpoints, goodput)."""
