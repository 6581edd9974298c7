"""The trace spec language: load, validate and convert users' specs (filter, hops, actions, events)."""
