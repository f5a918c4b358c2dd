"""The filter stage."""
