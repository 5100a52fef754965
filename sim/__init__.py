"""dtsim: a discrete-event simulator of distributed deep-learning training on GPU clusters."""

__version__ = "0.1.0"
