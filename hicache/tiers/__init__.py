"""hicache.tiers: the tiers below the device, and the cache that chains them.

``host`` is the host tier (L2: ``HostTier``, its in-flight transfers, the host pool's
construction, load-back checks); ``storage`` the storage tier (L3: ``StorageTier``, its backups
and prefetch reads over a ``hicache.backends`` backend). ``hiradix_cache.HiRadixCache`` builds
the chain (device -> host -> storage) and carries SGLang's calls. This module imports nothing,
so importing a tier does not import the cache built on it.
"""
