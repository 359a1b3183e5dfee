"""PagedKVCache (being written)."""


class PagedKVCache:  # placeholder until the foundation lands
    pass
