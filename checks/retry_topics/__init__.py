"""Exercise retry-topics (seed 004): non-blocking retries through a Kafka retry topic."""
