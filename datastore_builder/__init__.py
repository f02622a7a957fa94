"""Offline datastore builder: text or token records in, a datastore snapshot out.

Reads JSONL(.gz), Parquet and plain-text corpora as a stream, tokenizes them with a
Hugging Face ``tokenizers`` tokenizer (or takes token ids as they are), packs the
documents into suffix-array sub-indices and writes one snapshot directory with
:func:`drafter_service.snapshot.store.write_snapshot`. Command line: ``datastore-builder build``
(:mod:`datastore_builder.builder_cli`); from Python: :func:`drafter_service.corpus.pipeline.build`.
"""

from drafter_service.corpus.build_errors import BuildError

__all__ = ["BuildError"]
