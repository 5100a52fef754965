"""Checking dtsim against published training runs (``dtsim validate --published``); no torch needed."""
