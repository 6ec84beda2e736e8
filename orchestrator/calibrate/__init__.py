"""orchestrator.calibrate."""
