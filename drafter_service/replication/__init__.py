"""Replication: replicas that learn as one through a shared ingest stream
(docs/scale-out.md), above the live datastore, which knows nothing of it.

- ``shared_log``: the stream on the log server (Redis Streams), ``SharedLogConfig``;
- ``stream_follower``: the thread that takes the stream's entries into a live
  datastore's log, each exactly once;
- ``replicated_datastore``: ``ReplicatedDatastore``, the live datastore whose ingests
  go through the stream (read your writes), with its follower; no restore;
- ``peer_bootstrap``: a new replica's first snapshot, downloaded from a peer.
"""
