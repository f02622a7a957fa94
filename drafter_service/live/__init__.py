"""The live datastore: learns from finished generations (SSSD §3.1.3) through a
write-ahead ingest log, rebuilt into sub-indices in the background, snapshotted.

Its parts each own their fields and the lock that guards them (``live_datastore``'s
docstring lists them). An operation over several parts takes their locks in this
order, never the reverse:

1. the index set's structural-change lock (``IndexSet.changing``, the rebuild lock):
   one rebuild, snapshot, snapshot deletion, restore or corpus change at a time; held
   while sub-indices are built and snapshots written, so swaps reach ``on_swap`` in the
   order they were made;
2. the pending buffer's lock (it guards the ingest log too): held for the log's
   fsynced append, so ingests wait for each other but never for a rebuild or a
   snapshot write;
3. the stream cursor's lock;
4. the index set's lock: bookkeeping only (drafting's reads take it);
5. leaves, under which nothing else is taken: the last error's, the policy's (writes).

Besides (1), held around each structural change while it takes the others, the only
nestings: accepting a document holds the buffer's lock while it asks the cursor (a
duplicate? then advanced) and the index set (room for it?), so the memory bound and
each shared-stream entry's exactly-once hold exactly; a snapshot or restore holds the
buffer's lock while the index set records what the snapshot covers (a restore: swaps
its content in), so the buffer, the log and the coverage change at once.
``LiveDatastore.stats`` takes the parts' locks one at a time (``live_stats.live_stats``
says what that view guarantees).
"""
