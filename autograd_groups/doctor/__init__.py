"""Diagnose a NaN in a training step: where it is born, what kind it is, and fixes that are checked."""
