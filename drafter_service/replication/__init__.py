"""Replication: replicas that learn as one through a shared ingest stream
(docs/scale-out.md), above the live datastore, which knows nothing of it: ``shared_log``
(the Redis stream), ``replicated_datastore`` (ingests through the stream, and its follower
thread takes the stream into the live datastore's log, each entry once), ``peer_bootstrap``.
"""
