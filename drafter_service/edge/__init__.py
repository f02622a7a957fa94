"""The gRPC edge: authentication, load shedding, messages checked once and turned into
the engine's values, answers back into messages, refusals mapped to status codes."""
