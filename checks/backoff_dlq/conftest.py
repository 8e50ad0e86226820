"""backoff-dlq's fixtures: the learner runs its checks read (runs.py), loaded as a plugin.

They live in a plain module rather than here so that nothing imports a conftest: pytest loads this
file once, by path, and `runs` once, by its package name.
"""
pytest_plugins = ["retrylab.brokers.redis.fixtures", "retrylab.checks.backoff_dlq.runs"]
