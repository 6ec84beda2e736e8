"""orchestrator.launch."""
