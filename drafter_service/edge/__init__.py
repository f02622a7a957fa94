"""The gRPC edge: authentication, load shedding before a message is read, messages
checked once and turned into the engine's values, answers back into messages, and each
refusal mapped to its status code."""
