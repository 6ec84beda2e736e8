"""orchestrator.cli."""
