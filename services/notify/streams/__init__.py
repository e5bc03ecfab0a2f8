"""Client streams: the changes they carry, each stream's bounded inbox, the registry that
routes changes to local streams, the fan-out between replicas and the backstop."""
