"""Brokers: each kind (redis, ...) in a package of its own, with its private servers, relay and state reads."""
