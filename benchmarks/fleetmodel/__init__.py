"""A model of a run's fleet, calibrated on measured fleets, for projecting larger ones.

- :mod:`.sim`: the discrete-event simulation of one run (slots, driver, K mergers, shared cores)
- :mod:`.costs`: its costs, measured or fitted, and the merge's seconds by size and precision
- :mod:`.calibration`: the measured ``benchmarks/fleet.py`` points, the 5-point check, the fit

Not a benchmark itself (it has no ``__main__``): ``python -m benchmarks.fleetsim``
runs it; docs/fleet-model.md says what it models and what it leaves out.
"""
