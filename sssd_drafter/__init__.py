"""Generated protocol code (from proto/). Do not edit: run `make proto`."""
