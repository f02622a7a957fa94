"""SSSD drafting core and (later) the gRPC drafting service."""
