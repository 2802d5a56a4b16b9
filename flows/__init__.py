"""Prefect flows and thin tasks of vcdl: train (epochs), the epoch DAG, evaluate.

Tasks pass ids and URIs (a :class:`vcdl.runtime.RunRef`), never tensors; the
work itself is in the ``vcdl`` library, so these modules stay orchestration.
"""
