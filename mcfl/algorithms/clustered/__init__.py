"""Algorithms with K models, each client served by its cluster's or by a mixture of them, and the
pieces they share (`shared`, FlexCFL's `cold_start`, FeSEM-MA's `matching`)."""
