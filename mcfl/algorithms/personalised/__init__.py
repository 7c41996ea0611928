"""Algorithms that give each client a model of its own (wholly, or some of its layers)."""
