"""hicache.tiers.host: the host tier (L2) of a HiRadixCache.

``host_tier.HostTier`` owns the host side (a ``radix.tier.LowerTier``); ``host_link.HostLink``
answers the cache's host calls (the chain's first link); ``in_flight`` the transfers awaiting
an ack; ``host_storage_slots`` the pins the storage tier holds on host slots; ``host_build``
builds the host pool and the controller; ``two_tier`` the device/host eviction and load-back
steps; ``verified_load`` page integrity at load-back; ``host_checks`` its invariants.
"""
