"""A fleet of hosts on one machine, for tests and benchmarks: namespaces, links, faults.

Each worker host is a network namespace with its own address on a private
bridge; the services of the root namespace reach the hosts only through a
proxy that gives each host's link its latency, jitter and cuts, and tbf its
bandwidth. docs/network-fleet.md says what is emulated and what is not.

- :mod:`.fleet`: :class:`~benchmarks.netfleet.fleet.Fleet`, the whole of it, and its end
- :mod:`.session`: a fleet's names, its subnet, the clean-up of dead sessions
- :mod:`.netns`: bridge, namespaces, veth pairs, tbf and kills (``ip``, ``tc``)
- :mod:`.links`: a link's profile and its live state
- :mod:`.proxy`: the userspace TCP proxy: delays, jitter, loss as stalls, cuts
- :mod:`.hosts`: the command that starts a process on a host, the driver's files hidden
- :mod:`.dask_hosts`: the Dask scheduler and a ``dask worker`` per host

Not a benchmark itself (it has no ``__main__``): benchmarks and tests import it.
"""

from benchmarks.netfleet.fleet import DRIVER, Fleet, Host
from benchmarks.netfleet.links import LinkProfile

__all__ = ["DRIVER", "Fleet", "Host", "LinkProfile"]
