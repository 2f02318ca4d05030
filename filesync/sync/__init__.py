"""Sync orchestration: one pass over one pair, from frozen inputs to a report."""
