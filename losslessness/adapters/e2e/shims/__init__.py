"""Small servers run by an engine's own Python environment (never imported by the audit: each is
started as a script by :class:`~losslessness.adapters.e2e.process.ServerProcess`)."""
