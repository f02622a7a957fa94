"""sssd_drafter.v1 protocol stubs, generated from proto/sssd_drafter/v1/drafter.proto by `make proto`.

Committed so that GPU images need neither grpcio-tools nor a compiler; a test
regenerates them and fails on drift."""
