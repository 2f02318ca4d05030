"""The opt-in persistent agent behind ``--persist`` (top layer: it runs CLI commands)."""
