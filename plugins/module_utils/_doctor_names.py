# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The names of the doctor's own objects, the pid in them, and whether that pid can be judged here.

Every object a doctor run makes carries the run's pid in its name, so that a
later run can tell a killed run's leftovers from a live run's objects:

* the canary's ``--internal`` network ``pi-dispatch-egress-doctor-<pid>``;
* the probe containers ``pi-dispatch-egress-probe-<probe>-<pid>`` (the
  canary's, the model endpoints', the isolation peers', the squid check's and
  the firewall probe's);
* the isolation check's two job networks ``pi-job-doctor-<pid>-<a|b>-net``.

A pid is only judged (alive or dead) when the daemon is on this host
(:func:`daemon_locality`): a pid that is dead here may be alive there.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.pi_dispatch.egress.plugins.module_utils import _jobnet

NETWORK_PREFIX = 'pi-dispatch-egress-doctor-'
PROBE_PREFIX = 'pi-dispatch-egress-probe-'
NETWORK_RE = re.compile(r'^pi-dispatch-egress-doctor-(\d+)$')
PROBE_RE = re.compile(r'^pi-dispatch-egress-probe-([a-z0-9]+(?:-[a-z0-9]+)*?)-(\d+)$')
LABEL = 'io.pi-dispatch.egress.doctor'
PEERS = ('a', 'b')
# The isolation check's two job networks: real job networks (the job pool, our
# labels), named for the doctor's pid so the sweep finds them after a kill.
ISOLATION_NET_RE = re.compile(r'^pi-job-doctor-(\d+)-([ab])-net$')
ISOLATION_NET_PREFIX = 'pi-job-doctor-'


def network_name(pid):
    return '%s%d' % (NETWORK_PREFIX, int(pid))


def probe_name(probe, pid):
    return '%s%s-%d' % (PROBE_PREFIX, probe, int(pid))


def parse_doctor_network(name):
    """The pid in a doctor network's name, or None when the name is not exactly one.

    Two shapes: the canary's ``pi-dispatch-egress-doctor-<pid>`` and the
    isolation check's job networks ``pi-job-doctor-<pid>-<a|b>-net``.
    """
    match = NETWORK_RE.fullmatch(name or '') or ISOLATION_NET_RE.fullmatch(name or '')
    return int(match.group(1)) if match else None


def probe_pid(name):
    """The pid in a probe container's name, or None."""
    match = PROBE_RE.fullmatch((name or '').lstrip('/'))
    return int(match.group(2)) if match else None


def isolation_job_id(pid, peer):
    return 'doctor-%d-%s' % (int(pid), peer)


def isolation_network_name(pid, peer):
    return _jobnet.network_name(isolation_job_id(pid, peer))


def peer_name(peer, pid):
    return probe_name('peer-%s' % peer, pid)


def endpoint_probe_name(kind, endpoint_id, pid):
    """``pi-dispatch-egress-probe-endpoint-<kind>-<id>-<pid>`` (the seed's name; the sweep's PROBE_RE covers it)."""
    return probe_name('endpoint-%s-%s' % (kind, endpoint_id), pid)


def daemon_locality(docker_host, environ=None):
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


def pid_alive(pid):
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
