"""SSH transports: the client conduit and the in-process server the demo and tests use."""
