"""Pipeline schedules as plain data: per stage, the ordered list of actions it executes.

An action is (kind, microbatch, chunk): kind F (forward), B (backward; input + weight gradients unless
the schedule splits them) or W (weight gradients, zero-bubble schedules); chunk is the virtual stage
index on that device (interleaved schedules), 0 otherwise. The executor runs the list as given.
"""

from sim.schedules.actions import SCHEDULES, Action, build_schedule

__all__ = ["Action", "build_schedule", "SCHEDULES"]
