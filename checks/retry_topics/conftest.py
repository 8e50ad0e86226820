"""retry-topics' fixtures: the learner runs its checks read, loaded as plugins (one module per run)."""
pytest_plugins = ["retrylab.brokers.kafka.fixtures", "retrylab.checks.retry_topics.runs",
                  "retrylab.checks.retry_topics.run_main",
                  "retrylab.checks.retry_topics.run_durable"]
