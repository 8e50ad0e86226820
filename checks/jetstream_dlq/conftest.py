"""jetstream-dlq's fixtures: the learner runs its checks read, loaded as plugins (one module per run)."""
pytest_plugins = ["retrylab.brokers.nats.fixtures", "retrylab.checks.jetstream_dlq.runs",
                  "retrylab.checks.jetstream_dlq.run_setup",
                  "retrylab.checks.jetstream_dlq.run_main",
                  "retrylab.checks.jetstream_dlq.run_late_service",
                  "retrylab.checks.jetstream_dlq.run_two_workers"]
