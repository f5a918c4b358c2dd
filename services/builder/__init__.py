"""The builder stage."""
