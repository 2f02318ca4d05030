"""SSH transports: the asyncssh client and the in-process server the demo and tests use.

The client is ``conduit`` (``SshConduit``, ``connect``, ``SshTarget``), built on
``config`` (what ssh_config says about a host) and ``hostkeys`` (known_hosts
verification); all three take asyncssh from ``_asyncssh``. ``server`` is the
in-process server.
"""
