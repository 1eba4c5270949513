"""The cycle: engine, sessions, rows, policies, sampling, prompts, loading, stages."""
