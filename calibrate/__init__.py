"""Real-kernel calibration: measure GEMMs, memory bandwidth and collectives, fit models, write a profile.

This package is the only torch user in dtsim, and it imports torch lazily: loading and fitting a
profile (``calibrate.profile``, ``calibrate.fit``) works without torch installed.
"""
