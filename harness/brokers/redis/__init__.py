"""Redis: private servers (fake, redis-server, url, container), the recording relay, keyspace snapshots."""
