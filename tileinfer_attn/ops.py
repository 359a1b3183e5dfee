"""Python wrappers of the ops (being written)."""
__all__ = []
