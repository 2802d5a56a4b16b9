"""Prometheus metrics of a run's driver: figures from the ledger (:mod:`.figures`), the
endpoint that serves them (:mod:`.exporter`). See docs/metrics.md."""
