"""Fake implementations of the ops (being written)."""
