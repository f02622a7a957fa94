"""``python -m datastore_builder``: the same as the ``datastore-builder`` command."""

from datastore_builder.builder_cli import main

if __name__ == "__main__":
    raise SystemExit(main())
