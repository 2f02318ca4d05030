"""The host side: the host tree's scan, journaled apply and recovery, and the pair's state."""
