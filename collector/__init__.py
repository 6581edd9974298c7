"""hoptrace.collector."""
