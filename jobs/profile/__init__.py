"""jobs.profile."""
