"""Corpora to sub-indices: readers, records, tokenization, packing; the build pipeline
shared by the ``datastore-builder`` command and the admin API's corpus jobs."""
