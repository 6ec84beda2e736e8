"""orchestrator.config."""
