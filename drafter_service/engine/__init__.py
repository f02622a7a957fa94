"""The drafting engine: request state, the native work of each call in call order, the
finished generations on their way to storage. Plain values in and out (``calls``); it
knows nothing of gRPC, protocol messages or settings."""
