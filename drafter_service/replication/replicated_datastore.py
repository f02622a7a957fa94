"""A live datastore that learns from a shared ingest stream (scale-out).

:class:`ReplicatedDatastore` appends accepted documents to the stream, not the local log;
its :class:`StreamFollower` takes them into the log like every other replica's, and the
ingest waits briefly for that (read your writes). A restore is refused: the stream would
not share one replica's rollback (docs/scale-out.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Unpack

from drafter_service.datastore.tokens import TokenIds
from drafter_service.live.ingestion import checked_document
from drafter_service.live.live_datastore import LiveDatastore, LiveOptions, LivePolicy, LiveStats
from drafter_service.replication.shared_log import RedisStream
from drafter_service.replication.stream_follower import StreamFollower
from drafter_service.snapshot.store import SnapshotError, SnapshotInfo, TokenizerIdentity

_READ_YOUR_WRITE_S = 2.0  # how long an ingest through the stream waits to be taken here


class ReplicatedDatastore(LiveDatastore):
    """The live datastore under ``directory`` fed by (and closing) ``shared_log``."""

    def __init__(
        self,
        directory: str | Path,
        tokenizer: TokenizerIdentity,
        policy: LivePolicy | None = None,
        *,
        shared_log: RedisStream,
        **options: Unpack[LiveOptions],
    ) -> None:
        super().__init__(directory, tokenizer, policy, **options)
        self.shared_log = shared_log  # the shared ingest stream this datastore follows
        self._follower = StreamFollower(self, shared_log, self.directory.name)

    def ingest(self, tokens: TokenIds) -> int:
        """Appends one document to the stream and waits briefly for this replica to take
        it; returns the log's newest sequence number. Raises as :meth:`LiveDatastore.ingest`,
        or ``LogError`` when the log server does not take it (nothing is stored)."""
        doc = checked_document(tokens, self.policy, self.tokenizer.vocab_size)
        self.check_room(len(doc))
        self.wait_consumed(self.shared_log.append(doc), _READ_YOUR_WRITE_S)
        return self.wal_position

    def restore(self, name: str) -> SnapshotInfo:
        raise SnapshotError(
            "restore is refused while the datastore follows a shared ingest stream: "
            "a rollback on one replica would make it differ from the others, and the "
            "stream would not roll back. Restore without --shared-log on every replica"
        )

    def stats(self) -> LiveStats:
        f = self._follower
        return replace(
            super().stats(), shared_log=True, stream_skipped=f.skipped, stream_errors=f.errors,
            stream_lost=f.lost, stream_delay_s=f.delay_s,
        )  # fmt: skip

    def close(self) -> None:
        """Stops the stream follower, then the datastore, then closes the stream."""
        self._follower.stop()
        super().close()
        self.shared_log.close()
