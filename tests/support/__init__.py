"""Helpers shared by tests: subprocess servers and the letters server fixture logic."""
