"""``python -m datastore_builder``: the same as the ``datastore-builder`` command."""

from datastore_builder.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
