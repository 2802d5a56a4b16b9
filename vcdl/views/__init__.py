"""Read-only views of a run built from the ledger: status, audit, cost, artifacts."""
