"""Click commands of the CLI, one module each, registered in :mod:`losslessness.cli`."""
