"""Endpoints: the remote tree as one contract, over the python helper or plain POSIX tools."""
