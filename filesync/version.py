"""The distribution's version: one place, read by the build, ``--version`` and the agent."""

__version__ = "0.1.0"
