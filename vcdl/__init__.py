"""vcdl: VC-ASGD training of PyTorch models on preemptible machines.

The library (everything that is not orchestration) lives here; Prefect flows
live in the top-level ``flows`` package. See README.md and docs/.
"""

from __future__ import annotations

__version__ = "0.1.0"
