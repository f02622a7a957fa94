"""Datastore snapshots on disk: manifest, checksummed array files, save and load."""
