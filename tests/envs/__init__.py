"""Tests of ep_trl's own environments."""
