# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The names of the doctor's own objects, the pid in them, and whether that pid can be judged here.

Every object a doctor run makes carries the run's pid in its name, so that a
later run can tell a killed run's leftovers from a live run's objects:

* the canary's ``--internal`` network ``pi-dispatch-egress-doctor-<pid>``, and
  one more per running proxy shard, ``pi-dispatch-egress-doctor-<pid>-shard-<n>``
  (that shard attached with the proxy's name as its alias);
* the probe containers ``pi-dispatch-egress-probe-<probe>-<pid>`` (the
  canary's, the model endpoints', the isolation peers', the squid check's and
  the firewall probe's);
* the isolation check's two job networks ``pi-job-doctor-<pid>-<a|b>-net``.

A pid is only judged (alive or dead) when the daemon is on this host
(:func:`daemon_locality`): a pid that is dead here may be alive there.
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import names as _jobnet_names

NETWORK_PREFIX = 'pi-dispatch-egress-doctor-'
PROBE_PREFIX = 'pi-dispatch-egress-probe-'
NETWORK_RE = re.compile(r'^pi-dispatch-egress-doctor-(\d+)$')
# One more canary network per running proxy shard (the shard attached with the proxy's alias).
SHARD_NET_RE = re.compile(r'^pi-dispatch-egress-doctor-(\d+)-shard-([1-9]\d*)$')
SHARD_PROBE_RE = re.compile(r'^pi-dispatch-egress-probe-shard-([1-9]\d*)-[a-z0-9]+(?:-[a-z0-9]+)*-(\d+)$')
PROBE_RE = re.compile(r'^pi-dispatch-egress-probe-([a-z0-9]+(?:-[a-z0-9]+)*?)-(\d+)$')
LABEL = 'io.pi-dispatch.egress.doctor'
PEERS = ('a', 'b')
# The isolation check's two job networks: real job networks (the job pool, our
# labels), named for the doctor's pid so the sweep finds them after a kill.
ISOLATION_NET_RE = re.compile(r'^pi-job-doctor-(\d+)-([ab])-net$')
ISOLATION_NET_PREFIX = 'pi-job-doctor-'
# The probes (pi-dispatch-egress-probe-<probe>-<pid>) of checks that remove their own, and may run while the canary
# runs (doctor.BESIDE_CANARY) or after it: the canary's teardown never removes them (canary.teardown).
SELF_REMOVED = ('firewall', 'transparent', 'credentials', 'squid')


def network_name(pid: int) -> str:
    return '%s%d' % (NETWORK_PREFIX, int(pid))


def probe_name(probe: str, pid: int) -> str:
    return '%s%s-%d' % (PROBE_PREFIX, probe, int(pid))


def shard_network_name(pid: int, index: int) -> str:
    """``pi-dispatch-egress-doctor-<pid>-shard-<n>``: the canary network through proxy shard ``index``."""
    return '%s%d-shard-%d' % (NETWORK_PREFIX, int(pid), int(index))


def shard_key(index: int, key: str = '') -> str:
    """The probe key (and name part) of probe ``key`` through shard ``index``: ``shard-<n>-<key>``."""
    return 'shard-%d-%s' % (int(index), key)


def shard_probe_name(index: int, probe: str, pid: int) -> str:
    """``pi-dispatch-egress-probe-shard-<n>-<probe>-<pid>`` (PROBE_RE covers it, so the sweep does)."""
    return probe_name(shard_key(index, probe), pid)


def network_shard(name: Optional[str]) -> Optional[int]:
    """The shard index in a shard canary network's name, or None."""
    match = SHARD_NET_RE.fullmatch(name or '')
    return int(match.group(2)) if match else None


def probe_shard(name: Optional[str]) -> Optional[int]:
    """The shard index in a shard probe's name, or None (the proxy's own probes and every other probe)."""
    match = SHARD_PROBE_RE.fullmatch((name or '').lstrip('/'))
    return int(match.group(1)) if match else None


def parse_doctor_network(name: Optional[str]) -> Optional[int]:
    """The pid in a doctor network's name, or None when the name is not exactly one.

    Three shapes: the canary's ``pi-dispatch-egress-doctor-<pid>``, its shard
    networks ``pi-dispatch-egress-doctor-<pid>-shard-<n>`` and the isolation
    check's job networks ``pi-job-doctor-<pid>-<a|b>-net``.
    """
    name = name or ''
    match = NETWORK_RE.fullmatch(name) or SHARD_NET_RE.fullmatch(name) or ISOLATION_NET_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def probe_pid(name: Optional[str]) -> Optional[int]:
    """The pid in a probe container's name, or None."""
    match = PROBE_RE.fullmatch((name or '').lstrip('/'))
    return int(match.group(2)) if match else None


def isolation_job_id(pid: int, peer: str) -> str:
    return 'doctor-%d-%s' % (int(pid), peer)


def isolation_network_name(pid: int, peer: str) -> str:
    return _jobnet_names.network_name(isolation_job_id(pid, peer))


def peer_name(peer: str, pid: int) -> str:
    return probe_name('peer-%s' % peer, pid)


def endpoint_probe_name(kind: str, endpoint_id: str, pid: int) -> str:
    """``pi-dispatch-egress-probe-endpoint-<kind>-<id>-<pid>`` (the seed's name; the sweep's PROBE_RE covers it)."""
    return probe_name('endpoint-%s-%s' % (kind, endpoint_id), pid)


def daemon_locality(docker_host: Optional[str], environ: Optional[Mapping[str, str]] = None) -> Tuple[bool, str]:
    """(local, what_it_resolved) for the daemon the doctor talks to.

    Local only when the connection is a unix socket on this host: the default
    (no docker_host and no DOCKER_HOST) or an explicit ``unix://`` path. A
    tcp://, ssh:// or npipe:// daemon may be shared or remote, and a pid that is
    dead here may be alive there.
    """
    environ = os.environ if environ is None else environ
    host = docker_host or environ.get('DOCKER_HOST') or ''
    if not host:
        return True, 'resolved the default unix socket /var/run/docker.sock on this host'
    if host.startswith('unix://') or host.startswith('/'):
        return True, 'resolved %s on this host' % host
    return False, 'resolved %s, which is not a unix socket on this host' % host


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this host (signal 0)."""
    if pid <= 0:
        return True  # never claim a nonsense pid is dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True
