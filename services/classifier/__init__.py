"""The classifier stage."""
