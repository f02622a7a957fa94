"""Offline datastore builder (see issue 3)."""
