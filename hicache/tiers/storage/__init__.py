"""hicache.tiers.storage: the storage tier (L3) of a HiRadixCache, below the host tier.

``storage_tier.StorageTier`` attaches below the host through ``radix.tier.BelowHost``;
``storage_backup`` writes host pages out, ``storage_tiering`` decides when (inclusive: on the
host write's ack; exclusive: on host eviction), ``storage_reads`` prefetches them back;
``storage_build`` builds a tier from a ``StorageConfig``; ``storage_link.StorageLink`` answers
SGLang's storage calls (the chain's last link). The backends are ``hicache.backends``.
"""
