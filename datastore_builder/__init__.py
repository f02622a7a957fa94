"""Offline datastore builder: text or token records in, a datastore snapshot out.

Command line: ``datastore-builder build`` (:mod:`datastore_builder.builder_cli`); from
Python: :func:`drafter_service.corpus.pipeline.build` (errors: its ``BuildError``).
"""
