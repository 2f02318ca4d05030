"""Conduits: ways to run a command on the remote side with stdin/stdout pipes."""
