"""hicache.pools."""
