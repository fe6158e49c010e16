"""hicache.stress: seeded random scenarios, fault injection and a KV oracle for the cache."""
