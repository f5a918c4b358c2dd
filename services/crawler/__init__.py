"""The crawler stage."""
