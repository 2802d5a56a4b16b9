"""End-to-end tests: a real Prefect server, work pool, worker and browser."""
