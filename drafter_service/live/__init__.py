"""The live datastore: learns from finished generations (SSSD §3.1.3) through a
write-ahead ingest log, rebuilt into sub-indices in the background, snapshotted.

Each part owns its fields and lock (``live_datastore`` lists them). An operation over
several parts takes their locks in this order, never the reverse:

1. the index set's structural-change lock (``IndexSet.changing``): one rebuild, snapshot,
   deletion, restore or corpus change at a time, held while building and writing, so
   swaps reach ``on_swap`` in the order they were made;
2. the pending buffer's lock (it guards the log and the shared stream's position too):
   held for the fsynced append, so ingests wait for each other but never for a rebuild or
   a snapshot write;
3. a leaf: the policy's (writes).

The index set takes no lock of its own: its state is replaced whole under (1), so a read
(drafting's, a stats view) sees one state without waiting.

The only other nestings: accepting a document holds the buffer's lock while asking the
index set (room?), so the memory bound holds (and, the position being the buffer's,
exactly-once);
a snapshot or restore holds it while the index set records the new coverage, so buffer,
log and coverage change at once. ``LiveDatastore.stats`` takes the locks one at a time.
"""
