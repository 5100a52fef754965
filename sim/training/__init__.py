"""Training-loop behaviour that is independent of timing (loss scaling)."""
