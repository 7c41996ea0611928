"""Algorithms that train one model for every client."""
