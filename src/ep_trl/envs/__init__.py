"""Environments of ep_trl's own, served as local OpenEnv processes."""
