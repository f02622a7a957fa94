"""The REST admin API of ``drafter serve`` (FastAPI on its own port, same event loop as
gRPC): probes, datastore stats, snapshots, rebuilds, corpora and live settings."""
