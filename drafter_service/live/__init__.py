"""The live datastore: learns from finished generations (SSSD §3.1.3) through a
write-ahead ingest log, rebuilt into sub-indices in the background, snapshotted."""
