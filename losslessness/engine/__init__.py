"""The run engine: planning, sampling and budgeting of checks (device unit: ``device``)."""
