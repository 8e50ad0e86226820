"""stream-consumer's fixtures: the learner runs its checks read, loaded as plugins (one module per run)."""
pytest_plugins = ["retrylab.brokers.redis.fixtures", "retrylab.checks.stream_consumer.runs",
                  "retrylab.checks.stream_consumer.run_consume", "retrylab.checks.stream_consumer.run_retry",
                  "retrylab.checks.stream_consumer.run_crash", "retrylab.checks.stream_consumer.run_lag",
                  "retrylab.checks.stream_consumer.run_backpressure"]
