"""Small reference models that run on tileinfer_attn ops."""
