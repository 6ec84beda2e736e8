"""orchestrator.ui."""
