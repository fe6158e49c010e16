"""hicache.controller."""
