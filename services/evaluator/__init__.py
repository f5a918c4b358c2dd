"""The evaluator stage."""
