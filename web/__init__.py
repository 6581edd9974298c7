"""hoptrace.web."""
