"""Workarounds of Prefect and Dask behaviour, one module each, kept apart from the flows.

Each module's docstring names the upstream behaviour and the version it
works around (Prefect 3.8, prefect-dask 0.3.7, distributed 2026.8, as pinned
in pyproject.toml) and the test that guards it; when a pin moves, run those
tests first, and delete a workaround whose upstream fix has landed.

====================  ==============================================================
module                works around
====================  ==============================================================
``shared_runner``     prefect-dask closing its Dask client at every subflow's end
``task_settings``     Prefect's task engine rebuilding settings and API clients
                      per task on a Dask worker, and serializing them per submission
``heartbeats``        a subflow's heartbeat thread joined at its end (up to 1 s)
``task_runs``         task runs Prefect leaves Running when their workers die or the
                      driver cancels them; finished tasks Dask re-runs after a kill
``forkserver``        Dask's nanny spawning every (re)started worker from scratch
``warmup``            a worker's first task stalling on imports; Dask's
                      ``MALLOC_TRIM_THRESHOLD_`` slowing training; settings read
                      before the nanny set the environment
``watchdog``          a LocalCluster forgetting workers whose restart was slow
``dask_logs``         a normal disconnect logged at INFO with a traceback
``plugin_broadcast``  a worker lost while a plugin is broadcast failing the call
``api_server``        Prefect's temporary API server dying with the terminal's
                      Ctrl-C or systemd's SIGTERM, and outliving a killed driver
====================  ==============================================================
"""
