"""jobs.attention.cp."""
