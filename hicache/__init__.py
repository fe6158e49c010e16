"""hicache: a hierarchical prefix KV cache (GPU L1 + pinned-host L2) for LLM serving."""

__version__ = "0.1.0"
