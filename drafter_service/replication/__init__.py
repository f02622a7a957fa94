"""Replication: replicas that learn as one through a shared ingest stream
(docs/scale-out.md), above the live datastore, which knows nothing of it: ``shared_log``
(the Redis stream), ``stream_follower`` (takes it into a live datastore's log, each entry
once), ``replicated_datastore`` (ingests through the stream), ``peer_bootstrap``.
"""
