"""Decode-side client: tree packing and lossless verification (see issue 5)."""
