"""MemAgent (seed 000): heterogeneous memory providers, forced exploration and an SFT router for Begin/In/End."""
