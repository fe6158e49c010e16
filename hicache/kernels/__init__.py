"""hicache.kernels."""
