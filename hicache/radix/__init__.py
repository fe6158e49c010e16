"""hicache.radix."""
