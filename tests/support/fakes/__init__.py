"""Fake vendor APIs (Replicate, fal) written from the vendors' documentation, for testing
the provider adapters against the vendors' protocols rather than against themselves."""
