"""``vcdl fleet check``: whether every worker of a Dask cluster can do a run's job.

Run from the driver's machine against a scheduler's address, with a run's
config for the store, ledger and code to check (docs/spot-fleet.md,
"Checking a fleet"):

- :mod:`.probe`: what runs on each worker (scheduler, store, ledger,
  versions), shipped there with ``client.run``;
- :mod:`.environment`: the probe's child process on the worker (torch, the
  device, the run's code imported);
- :mod:`.gather`: the driver's side: the probe's request from a config, the
  scheduler's workers, their clocks and answers, each under a timeout;
- :mod:`.clock`: a clock's offset bounded by its round trip (pure);
- :mod:`.verdict`: which worker cannot do the job, and why (pure);
- :mod:`.render`: the ``--json`` document and the text (pure).
"""
