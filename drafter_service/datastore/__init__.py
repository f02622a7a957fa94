"""The datastore: immutable suffix-array sub-indices over token documents, and the checks
of token-id inputs they rely on."""
