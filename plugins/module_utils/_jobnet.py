# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Per-job networks: names, subnets, create, teardown, the sweep, the preflight.

One ``--internal`` network per job, ``pi-job-<id>-net``, holding exactly the
job container ``pi-job-<id>`` and the egress proxy. This file is the whole
lifecycle as plain Python, so that a job runner can import it and call it
directly (no Ansible process per job), and the modules ``job_network``,
``job_network_gc`` and ``egress_preflight`` are thin adapters over it.

Pure parts (no daemon, unit-tested with tables):

* :func:`validate_job_id`, :func:`network_name`, :func:`container_name`,
  :func:`job_id_from_network_name`, :func:`job_labels`, :func:`job_env`;
* :func:`allocate_subnet` and the route parsers;
* :func:`decide_sweep`, the garbage collector's decision for one network;
* :func:`verdict_for_state`, the preflight's decision.

Daemon parts take a ``docker.DockerClient`` (from ``_docker_client.connect``)
and use its low-level ``client.api`` so that each step is exactly one Engine
API call: :func:`create_job_network`, :func:`teardown_job_network`,
:func:`sweep`, :func:`preflight`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import ipaddress
import json
import re
import socket
import subprocess
import threading
import time

from ansible_collections.pi_dispatch.egress.plugins.module_utils._docker_client import (
    EngineError,
    EngineUnavailable,
    api_message,
    docker_errors,
    get_container,
)

# --------------------------------------------------------------------------
# Contract names (defaults; every one is a parameter)
# --------------------------------------------------------------------------

PROXY_NAME = 'pi-dispatch-egress-proxy'
PROXY_PORT = 3128
NETWORK_PREFIX = 'pi-job-'
NETWORK_SUFFIX = '-net'
CONTAINER_PREFIX = 'pi-job-'

# Dedicated pool for job networks. 10.47.0.0/16 sits outside Docker's default
# address pools (172.17.0.0/16-172.31.0.0/16 and 192.168.0.0/16), Podman's
# (10.88.0.0/16, 10.89.0.0/16 onward), the Kubernetes defaults (10.96.0.0/12
# services, 10.244.0.0/16 flannel pods) and the GCP auto-mode range
# (10.128.0.0/9). Overlap with whatever THIS host uses is checked on every
# allocation regardless, so the choice only has to be unlikely, not safe.
DEFAULT_POOL = '10.47.0.0/16'
# A job network holds two endpoints (job + proxy) plus the bridge gateway: a
# /29 has 5 usable addresses (a /30 has 2, too few).
DEFAULT_PREFIX = 29
MAX_PREFIX = 29

LABEL_PREFIX = 'io.pi-dispatch.egress.'
LABEL_JOB_ID = LABEL_PREFIX + 'job-id'
LABEL_CREATED = LABEL_PREFIX + 'created'
LABEL_OWNER_HOST = LABEL_PREFIX + 'owner-host'

NO_PROXY = 'localhost,127.0.0.1,::1'

JOB_ID_MAX = 64
_JOB_ID_RE = re.compile(r'^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?\Z')  # \Z: '$' admits a trailing newline

# How many times create re-reads the taken subnets when another creator won
# the race for the one it picked (the daemon refuses overlapping pools).
CREATE_ATTEMPTS = 5

_ALLOC_LOCK = threading.Lock()


class JobNetError(ValueError):
    """Bad input (a job id, a pool, a prefix): nothing was changed."""


class PoolExhausted(EngineError):
    """No free subnet of the requested size is left in the pool."""


# --------------------------------------------------------------------------
# Names, labels, environment (pure)
# --------------------------------------------------------------------------

def validate_job_id(job_id, key='job_id'):
    """Return ``job_id`` when it may name a network and a container; else raise JobNetError.

    Letters, digits, ``-`` and ``_``; it starts and ends with a letter or a
    digit; 1 to 64 characters. Checked before any name is built from it.
    """
    if not isinstance(job_id, str):
        raise JobNetError(
            "%s must be a string, got %s %r. Pass the job's id as text, e.g. '1234' or 'job-1234'."
            % (key, type(job_id).__name__, job_id))
    if len(job_id) > JOB_ID_MAX:
        raise JobNetError(
            "%s %r is refused: it is %d characters long and at most %d are allowed "
            "(it names the network %s<id>%s and the container %s<id>). Use a shorter id."
            % (key, job_id, len(job_id), JOB_ID_MAX, NETWORK_PREFIX, NETWORK_SUFFIX, CONTAINER_PREFIX))
    if not _JOB_ID_RE.match(job_id):
        raise JobNetError(
            "%s %r is refused: use only letters, digits, '-' and '_', starting and ending with a "
            "letter or a digit, 1 to %d characters (it names the network %s<id>%s and the "
            "container %s<id>). For example 'job-1234'."
            % (key, job_id, JOB_ID_MAX, NETWORK_PREFIX, NETWORK_SUFFIX, CONTAINER_PREFIX))
    return job_id


_ID_PREFIX_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_-]*\Z')


def validate_id_prefix(id_prefix, key='id_prefix'):
    """An id prefix ('' for none) may end in '-' or '_' ('it5-'); else as a job id."""
    if id_prefix in (None, ''):
        return ''
    if not isinstance(id_prefix, str) or len(id_prefix) > JOB_ID_MAX or not _ID_PREFIX_RE.match(id_prefix):
        raise JobNetError(
            "%s %r is refused: use letters, digits, '-' and '_', starting with a letter or a digit, "
            "at most %d characters (for example 'it5-')." % (key, id_prefix, JOB_ID_MAX))
    return id_prefix


def network_name(job_id):
    return NETWORK_PREFIX + validate_job_id(job_id) + NETWORK_SUFFIX


def container_name(job_id):
    return CONTAINER_PREFIX + validate_job_id(job_id)


def looks_like_job_network(name):
    """True for ``pi-job-<anything>-net`` (valid id or not)."""
    return (isinstance(name, str) and name.startswith(NETWORK_PREFIX) and name.endswith(NETWORK_SUFFIX)
            and len(name) > len(NETWORK_PREFIX) + len(NETWORK_SUFFIX))


def job_id_from_network_name(name):
    """The job id when ``name`` is exactly a job network name, else None."""
    if not looks_like_job_network(name):
        return None
    job_id = name[len(NETWORK_PREFIX):-len(NETWORK_SUFFIX)]
    try:
        validate_job_id(job_id)
    except JobNetError:
        return None
    return job_id


def format_time(epoch):
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(epoch))


_TIME_RE = re.compile(r'^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$')


def parse_time(text):
    """Epoch seconds for an RFC 3339 time (ours or the daemon's ``Created``), else None."""
    if not isinstance(text, str):
        return None
    match = _TIME_RE.match(text.strip())
    if not match:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        epoch = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    frac = match.group(7)
    if frac:
        epoch += float('0' + frac[:10])
    zone = match.group(8)
    if zone != 'Z':
        sign = 1 if zone[0] == '+' else -1
        epoch -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    # The daemon reports 0001-01-01T00:00:00Z for "unknown".
    if year < 1971:
        return None
    return epoch


def job_labels(job_id, now=None, host=None):
    """The labels that mark a job network as ours."""
    validate_job_id(job_id)
    return {
        LABEL_JOB_ID: job_id,
        LABEL_CREATED: format_time(time.time() if now is None else now),
        LABEL_OWNER_HOST: host if host is not None else socket.gethostname(),
    }


def proxy_url(proxy_name=PROXY_NAME, proxy_port=PROXY_PORT):
    return 'http://%s:%d' % (proxy_name, int(proxy_port))


def job_env(proxy_name=PROXY_NAME, proxy_port=PROXY_PORT, no_proxy=NO_PROXY):
    """The environment a job container needs on its network (uppercase only).

    ``NODE_USE_ENV_PROXY=1`` makes Node's global fetch honour the variables;
    the seed's worker sets all four itself.
    """
    url = proxy_url(proxy_name, proxy_port)
    return {
        'HTTPS_PROXY': url,
        'HTTP_PROXY': url,
        'NO_PROXY': no_proxy,
        'NODE_USE_ENV_PROXY': '1',
    }


class JobNetwork(object):
    """What a job runner needs to start the job container on its network."""

    def __init__(self, job_id, network, container, subnet, env, network_id=None, changed=False,
                 actions=None):
        self.job_id = job_id
        self.network = network
        self.container = container
        self.subnet = subnet
        self.env = env
        self.network_id = network_id
        self.changed = changed
        self.actions = list(actions or [])

    def run_args(self):
        """``docker run`` arguments for the job container (name, network, env)."""
        args = ['--name', self.container, '--network', self.network]
        for key in sorted(self.env):
            args += ['-e', '%s=%s' % (key, self.env[key])]
        return args

    def as_dict(self):
        return dict(job_id=self.job_id, network=self.network, container=self.container,
                    subnet=self.subnet, env=dict(self.env), network_id=self.network_id,
                    changed=self.changed, actions=list(self.actions))

    def __repr__(self):
        return 'JobNetwork(%r)' % (self.as_dict(),)


# --------------------------------------------------------------------------
# Subnets (pure allocator + readers)
# --------------------------------------------------------------------------

def parse_pool(pool, prefix, pool_key='pool', prefix_key='prefix'):
    """Validate a pool and a per-job prefix; return (IPv4Network, int)."""
    try:
        net = ipaddress.ip_network(str(pool), strict=True)
    except ValueError as exc:
        raise JobNetError(
            "%s %r is not an IPv4 network in CIDR form with no host bits set (%s). "
            "For example '%s'." % (pool_key, pool, exc, DEFAULT_POOL))
    if net.version != 4:
        raise JobNetError("%s %r is IPv6; job networks take IPv4 subnets. For example '%s'."
                          % (pool_key, pool, DEFAULT_POOL))
    try:
        prefix = int(prefix)
    except (TypeError, ValueError):
        raise JobNetError("%s %r is not a number; use a prefix length such as %d."
                          % (prefix_key, prefix, DEFAULT_PREFIX))
    if prefix > MAX_PREFIX or prefix < net.prefixlen:
        raise JobNetError(
            "%s %d does not fit: it must be between the pool's own /%d and /%d (a job network "
            "needs the gateway, the job and the proxy, and a /30 holds only two addresses). "
            "Use %s %d." % (prefix_key, prefix, net.prefixlen, MAX_PREFIX, prefix_key, DEFAULT_PREFIX))
    return net, prefix


def pool_capacity(pool=DEFAULT_POOL, prefix=DEFAULT_PREFIX):
    net, prefix = parse_pool(pool, prefix)
    return 2 ** (prefix - net.prefixlen)


def _as_networks(items):
    out = []
    for item in items:
        try:
            net = item if isinstance(item, ipaddress.IPv4Network) else ipaddress.ip_network(str(item), strict=False)
        except ValueError:
            continue
        if net.version == 4:
            out.append(net)
    return out


def allocate_subnet(pool, prefix, taken):
    """The lowest /``prefix`` of ``pool`` that overlaps nothing in ``taken``.

    ``taken`` is any iterable of IPv4 networks (or CIDR strings): existing
    docker networks' subnets and the host's routes. Pure; raises
    PoolExhausted naming what blocked the pool.
    """
    pool, prefix = parse_pool(pool, prefix)
    size = 2 ** (32 - prefix)
    start = int(pool.network_address)
    end = int(pool.broadcast_address)
    blocking = [n for n in _as_networks(taken) if n.overlaps(pool)]
    intervals = sorted((int(n.network_address), int(n.broadcast_address)) for n in blocking)
    cand = start
    for low, high in intervals:
        if cand + size - 1 < low:
            break
        if high >= cand:
            cand = ((high + 1 + size - 1) // size) * size
        if cand > end:
            break
    if cand + size - 1 > end:
        shown = ', '.join(str(n) for n in sorted(set(blocking))[:5])
        more = len(set(blocking)) - 5
        raise PoolExhausted(
            "No free /%d is left in the job network pool %s (%d fit in it; taken or overlapping: "
            "%s%s). Tear down or sweep finished job networks (playbooks/gc.yml), or give a larger "
            "or different pool." % (prefix, pool, 2 ** (prefix - pool.prefixlen), shown,
                                    ' and %d more' % more if more > 0 else ''))
    return ipaddress.ip_network((cand, prefix))


def parse_ip_json_routes(text):
    """Destinations from ``ip -j route`` output; the default route is left out."""
    try:
        routes = json.loads(text or '[]')
    except ValueError:
        return []
    out = []
    for route in routes if isinstance(routes, list) else []:
        dst = route.get('dst') if isinstance(route, dict) else None
        if not dst or dst == 'default':
            continue
        if '/' not in dst:
            dst += '/32'
        out.extend(_as_networks([dst]))
    return [n for n in out if n.prefixlen > 0]


def parse_proc_net_route(text):
    """Destinations from /proc/net/route (little-endian hex); default route left out."""
    out = []
    for line in (text or '').splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dst = int(fields[1], 16)
            mask = int(fields[7], 16)
        except ValueError:
            continue
        dst = socket.ntohl(dst)
        mask = socket.ntohl(mask)
        plen = bin(mask).count('1')
        if plen == 0:
            continue
        try:
            out.append(ipaddress.ip_network((dst, plen), strict=False))
        except ValueError:
            continue
    return out


def read_host_routes():
    """The host's IPv4 route destinations (main table), without the default route."""
    try:
        with open('/proc/net/route') as handle:
            return parse_proc_net_route(handle.read())
    except (IOError, OSError):
        pass
    try:
        out = subprocess.run(['ip', '-j', '-4', 'route'], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=10, check=False).stdout
        return parse_ip_json_routes(out.decode('utf-8', 'replace'))
    except (OSError, subprocess.SubprocessError):
        return []


def network_subnets(networks):
    """IPv4 subnets used by docker networks (dicts as the Engine API lists them)."""
    out = []
    for net in networks:
        for cfg in ((net.get('IPAM') or {}).get('Config') or []):
            if cfg.get('Subnet'):
                out.extend(_as_networks([cfg['Subnet']]))
    return out


def _subnet_of(net):
    subs = network_subnets([net])
    return str(subs[0]) if subs else None


# --------------------------------------------------------------------------
# Engine helpers
# --------------------------------------------------------------------------

def _is_not_found(exc):
    return getattr(getattr(exc, 'response', None), 'status_code', None) == 404


def _connection_failed(exc):
    """True when the daemon gave no answer at all (nothing was decided).

    docker.errors.APIError derives from requests' HTTPError, which derives
    from IOError/OSError, so an OSError test alone would call every refusal
    the daemon DID answer ("pool overlaps", "already exists", 404) a
    connection failure. An exception carrying an HTTP response is an answer.
    """
    if isinstance(exc, EngineError):
        return isinstance(exc, EngineUnavailable)
    if docker_errors is not None and isinstance(exc, docker_errors.APIError):
        return False
    if getattr(exc, 'response', None) is not None:
        return False
    name = type(exc).__name__
    return name in ('ConnectionError', 'ReadTimeout', 'ConnectTimeout', 'Timeout') or isinstance(exc, OSError)


def _engine_error(what, exc):
    if isinstance(exc, EngineError):
        return exc
    if _connection_failed(exc):
        return EngineUnavailable('%s: the Docker Engine does not answer (%s)' % (what, exc))
    return EngineError('%s: %s' % (what, api_message(exc)))


def inspect_job_network(client, name):
    """The network's inspect dict, or None. Exact name only.

    Inspecting by a ``pi-job-...`` name cannot match an id prefix (ids are
    hex), and the returned name is compared anyway.
    """
    try:
        attrs = client.api.inspect_network(name)
    except Exception as exc:
        if _is_not_found(exc):
            return None
        raise _engine_error('Inspecting network %s failed' % name, exc)
    if attrs.get('Name') != name:
        return None
    return attrs


def _ownership_problem(attrs, job_id):
    """None when the network may be treated as ours, else why not (for errors)."""
    labels = attrs.get('Labels') or {}
    if LABEL_JOB_ID in labels:
        if labels[LABEL_JOB_ID] != job_id:
            return 'its label %s says job %r' % (LABEL_JOB_ID, labels[LABEL_JOB_ID])
        return None
    if labels:
        return 'it carries labels that are not ours (%s)' % ', '.join(sorted(labels))
    return None


def _proxy_on(attrs, proxy_name):
    return any((c or {}).get('Name') == proxy_name for c in (attrs.get('Containers') or {}).values())


def _already_connected(message):
    text = message.lower()
    return 'already exists in network' in text or 'already attached' in text or 'already connected' in text


def _not_connected(message):
    text = message.lower()
    return ('is not connected' in text or 'not connected to' in text or 'no such container' in text
            or ('container' in text and 'not found' in text))


def _connect_proxy(client, net_ref, proxy_name):
    """Attach the proxy; True when attached now, False when it already was."""
    try:
        client.api.connect_container_to_network(proxy_name, net_ref)
    except Exception as exc:
        if _connection_failed(exc):
            raise _engine_error('Attaching %s failed' % proxy_name, exc)
        if _already_connected(api_message(exc)):
            return False
        raise EngineError(api_message(exc))
    return True


def _disconnect(client, container, net_ref):
    """Force-detach; True when detached, False when it was not attached."""
    try:
        client.api.disconnect_container_from_network(container, net_ref, force=True)
    except Exception as exc:
        if _connection_failed(exc):
            raise _engine_error('Detaching %s failed' % container, exc)
        message = api_message(exc)
        if _is_not_found(exc) or _not_connected(message):
            return False
        raise EngineError(message)
    return True


def _remove_network(client, net_ref):
    """True when removed, False when it was already gone."""
    try:
        client.api.remove_network(net_ref)
    except Exception as exc:
        if _is_not_found(exc):
            return False
        if _connection_failed(exc):
            raise _engine_error('Removing network %s failed' % net_ref, exc)
        raise EngineError(api_message(exc))
    return True


# --------------------------------------------------------------------------
# Create and teardown
# --------------------------------------------------------------------------

def _list_networks(client):
    try:
        return client.api.networks()
    except Exception as exc:
        raise _engine_error('Listing networks failed', exc)


def _taken(nets, routes):
    taken = network_subnets(nets)
    taken += read_host_routes() if routes is None else _as_networks(routes)
    return taken


def plan_subnet(client, pool=DEFAULT_POOL, prefix=DEFAULT_PREFIX, routes=None):
    """Pick a subnet (read-only): one network listing plus the host's routes."""
    nets = _list_networks(client)
    return allocate_subnet(pool, prefix, _taken(nets, routes))


def _overlap_refused(message):
    return 'overlap' in message.lower()


def _existing_job_network(client, nets, name, job_id, proxy_name, env, cname, check_mode):
    listed = [n for n in nets if n.get('Name') == name]
    attrs = inspect_job_network(client, name) if listed else None
    if attrs is None:
        return None
    problem = _ownership_problem(attrs, job_id)
    if problem:
        raise EngineError(
            "Network %s exists but is not this job's: %s. Nothing was changed. Remove it "
            "(docker network rm %s) or use another job id." % (name, problem, name))
    if not attrs.get('Internal'):
        raise EngineError(
            "Network %s exists and is not --internal, so it routes off this host. Nothing was "
            "changed. Remove it (docker network rm %s) and create the job network again."
            % (name, name))
    actions = []
    if not _proxy_on(attrs, proxy_name):
        if check_mode:
            actions.append('attach %s' % proxy_name)
        else:
            try:
                if _connect_proxy(client, attrs['Id'], proxy_name):
                    actions.append('attach %s' % proxy_name)
            except EngineError as exc:
                raise EngineError(
                    "Attaching the proxy %s to the existing network %s failed: %s. The network "
                    "was left as it was. Start or create the proxy (playbooks/site.yml), then "
                    "retry." % (proxy_name, name, exc))
    return JobNetwork(job_id, name, cname, _subnet_of(attrs), env, attrs.get('Id'),
                      changed=bool(actions), actions=actions)


def create_job_network(client, job_id, proxy_name=PROXY_NAME, proxy_port=PROXY_PORT, pool=DEFAULT_POOL,
                       prefix=DEFAULT_PREFIX, routes=None, no_proxy=NO_PROXY, check_mode=False,
                       now=None, owner_host=None):
    """Create ``pi-job-<id>-net`` (--internal, labelled, a subnet from the pool), attach the proxy.

    Idempotent: an existing network of ours that is internal is kept, and the
    proxy is attached when it is not. An existing network with another job's
    label, foreign labels, or without --internal is refused (nothing changed).
    If attaching the proxy fails, the network this call created is removed
    again and EngineError carries the daemon's reason.

    ``routes``: None reads this host's routes (right for a local daemon);
    pass ``[]`` (or the daemon host's routes) for a remote daemon.
    Engine calls on the ordinary path: list networks, create, connect.
    Returns a JobNetwork.
    """
    validate_job_id(job_id)
    parse_pool(pool, prefix)
    name = network_name(job_id)
    env = job_env(proxy_name, proxy_port, no_proxy)
    cname = container_name(job_id)
    labels = job_labels(job_id, now=now, host=owner_host)

    if check_mode:
        nets = _list_networks(client)
        found = _existing_job_network(client, nets, name, job_id, proxy_name, env, cname, True)
        if found is not None:
            return found
        subnet = allocate_subnet(pool, prefix, _taken(nets, routes))
        return JobNetwork(job_id, name, cname, str(subnet), env, None, changed=True,
                          actions=['create %s (%s)' % (name, subnet), 'attach %s' % proxy_name])

    from docker.types import IPAMConfig, IPAMPool

    net_id = None
    subnet = None
    last = None
    with _ALLOC_LOCK:
        for _attempt in range(CREATE_ATTEMPTS):
            nets = _list_networks(client)
            found = _existing_job_network(client, nets, name, job_id, proxy_name, env, cname, False)
            if found is not None:
                return found
            subnet = allocate_subnet(pool, prefix, _taken(nets, routes))
            try:
                resp = client.api.create_network(
                    name, driver='bridge', internal=True, labels=labels, check_duplicate=True,
                    ipam=IPAMConfig(pool_configs=[IPAMPool(subnet=str(subnet))]))
                net_id = resp['Id']
                break
            except Exception as exc:
                if _connection_failed(exc):
                    raise _engine_error('Creating network %s failed' % name, exc)
                last = api_message(exc)
                # Another creator took that subnet, or created this very
                # network, meanwhile: read again and converge.
                if _overlap_refused(last) or 'already exists' in last.lower():
                    continue
                raise EngineError("Creating network %s (%s) failed: %s. Nothing was created."
                                  % (name, subnet, last))
        else:
            raise EngineError(
                "Creating network %s failed %d times because what it picked from %s was taken "
                "meanwhile (%s). Retry, or give job networks a pool nothing else allocates from."
                % (name, CREATE_ATTEMPTS, pool, last))

    try:
        _connect_proxy(client, net_id, proxy_name)
    except EngineError as exc:
        reason = str(exc)
        try:
            _remove_network(client, net_id)
            cleanup = 'the network was removed again, nothing is left'
        except EngineError as rm_exc:
            cleanup = ('removing the network again ALSO failed (%s): remove it with docker '
                       'network rm %s' % (rm_exc, name))
        raise EngineError(
            "Attaching the proxy %s to %s failed: %s; %s. Start or create the proxy "
            "(playbooks/site.yml), check it with the egress_preflight module, then retry."
            % (proxy_name, name, reason, cleanup))
    return JobNetwork(job_id, name, cname, str(subnet), env, net_id, changed=True,
                      actions=['create %s (%s)' % (name, subnet), 'attach %s' % proxy_name])


def teardown_job_network(client, job_id, proxy_name=PROXY_NAME, check_mode=False):
    """Detach the proxy (forced), then remove ``pi-job-<id>-net``.

    Refuses, changing nothing, while any container other than the proxy is
    still running on the network: stop and remove the job container first.
    Never removes a container. Returns dict(changed, network, actions).
    """
    validate_job_id(job_id)
    name = network_name(job_id)
    attrs = inspect_job_network(client, name)
    if attrs is None:
        return dict(changed=False, network=name, actions=[])
    problem = _ownership_problem(attrs, job_id)
    if problem:
        raise EngineError("Network %s is not this job's: %s. Nothing was changed." % (name, problem))
    # A stopped or created container is configured on the network without an
    # active endpoint (so it is not in the inspect's Containers); removing the
    # network would leave it unable to start. One filtered listing finds both.
    try:
        configured = client.api.containers(all=True, filters={'network': attrs['Id']})
    except Exception as exc:
        raise _engine_error('Listing the containers on %s failed' % name, exc)
    listed = dict((_container_name(c), (c.get('State') or 'unknown').lower()) for c in configured)
    for cid, endpoint in (attrs.get('Containers') or {}).items():
        listed.setdefault((endpoint or {}).get('Name') or cid[:12], 'endpoint')
    others = sorted('%s (%s)' % (n, st) for n, st in listed.items() if n != proxy_name)
    if others:
        first = others[0].split(' ')[0]
        raise EngineError(
            "Network %s still has %s on it. Nothing was changed. Stop and remove the job "
            "container first (docker stop %s && docker rm %s), then tear the network down."
            % (name, ', '.join(others), first, first))
    actions = (['detach %s' % proxy_name] if _proxy_on(attrs, proxy_name) else []) + ['remove %s' % name]
    if check_mode:
        return dict(changed=True, network=name, actions=actions)
    net_id = attrs['Id']
    try:
        detached = _disconnect(client, proxy_name, net_id)
    except EngineError as exc:
        raise EngineError("Detaching the proxy %s from %s failed: %s. The network is still there; "
                          "retry the teardown." % (proxy_name, name, exc))
    try:
        removed = _remove_network(client, net_id)
    except EngineError as exc:
        raise EngineError(
            "Removing %s failed: %s. If it says the network has active endpoints, docker network "
            "inspect %s shows what is still on it; stop and remove that container, then retry."
            % (name, exc, name))
    done = (['detach %s' % proxy_name] if detached else []) + (['remove %s' % name] if removed else [])
    return dict(changed=bool(done), network=name, actions=done)


# --------------------------------------------------------------------------
# Garbage collection: the pure decision and the sweep over the daemon
# --------------------------------------------------------------------------

KEEP_REASONS = {
    'job-id-invalid': 'the name looks like a job network but the id in it is not a valid job id',
    'foreign-labels': 'the network carries labels, none of them ours',
    'label-mismatch': "our job-id label names another job than the network's name",
    'age-unknown': 'a minimum age is set and the creation time cannot be read',
    'too-young': 'younger than the minimum age: a job may be setting it up right now',
    'job-running': "the job's container is running (or paused, or restarting) on it",
    'member-running': 'a container other than the proxy and the job is running on it',
    'job-created': "the job's container is created and not started: it would lose its network",
    'job-stopped': "the job's container is stopped (exited or dead) and remove_exited_jobs is off: "
                   "it would lose its network",
    'member-stopped': 'a container other than the proxy is stopped or created on it: it would lose its network',
    'member-removing': 'a container on it is being removed right now; the next sweep takes it',
}

LIVE_STATES = ('running', 'paused', 'restarting')
STOPPED_STATES = ('created', 'exited', 'dead')
OVER_STATES = ('exited', 'dead')
MISSING = 'missing'  # an endpoint whose container no longer exists (stale)

# Precedence when several members each keep the network.
_KEEP_ORDER = ('job-running', 'member-running', 'job-created', 'job-stopped', 'member-stopped',
               'member-removing')


class SweepDecision(object):
    """``action`` is 'remove', 'keep' or None (not a candidate)."""

    def __init__(self, action, job_id=None, reason=None, detach=None, remove_containers=None):
        self.action = action
        self.job_id = job_id
        self.reason = reason
        self.detach = list(detach or [])
        self.remove_containers = list(remove_containers or [])

    def __eq__(self, other):
        return isinstance(other, SweepDecision) and self.__dict__ == other.__dict__

    def __ne__(self, other):
        return not self == other

    def __repr__(self):
        return 'SweepDecision(%r)' % (self.__dict__,)


def decide_sweep(name, labels, created, members, now, min_age=0, proxy_name=PROXY_NAME,
                 remove_exited_jobs=False, id_prefix=''):
    """What the sweep does with one network. Pure.

    ``labels``: the network's labels; ``created``: epoch seconds or None;
    ``members``: [{'name': ..., 'state': ...}] for every container configured
    on it (``state`` as docker says, or 'missing' for a stale endpoint);
    ``now``: epoch seconds. ``id_prefix`` limits the sweep to job ids that
    start with it (tests and shared daemons).
    """
    if not looks_like_job_network(name):
        return SweepDecision(None)
    job_id = job_id_from_network_name(name)
    if job_id is None:
        raw = name[len(NETWORK_PREFIX):-len(NETWORK_SUFFIX)]
        if id_prefix and not raw.startswith(id_prefix):
            return SweepDecision(None)
        return SweepDecision('keep', raw, 'job-id-invalid')
    if id_prefix and not job_id.startswith(id_prefix):
        return SweepDecision(None)
    labels = labels or {}
    if LABEL_JOB_ID in labels:
        if labels[LABEL_JOB_ID] != job_id:
            return SweepDecision('keep', job_id, 'label-mismatch')
    elif labels:
        return SweepDecision('keep', job_id, 'foreign-labels')
    if min_age and min_age > 0:
        if created is None:
            return SweepDecision('keep', job_id, 'age-unknown')
        if now - created < min_age:
            return SweepDecision('keep', job_id, 'too-young')
    job_container = CONTAINER_PREFIX + job_id
    reasons = set()
    detach = []
    remove_containers = []
    for member in members or []:
        mname = member.get('name')
        state = (member.get('state') or '').lower()
        if mname == proxy_name:
            detach.append(mname)
            continue
        is_job = mname == job_container
        if state in LIVE_STATES:
            reasons.add('job-running' if is_job else 'member-running')
        elif state == 'created':
            reasons.add('job-created' if is_job else 'member-stopped')
        elif state in OVER_STATES:
            if is_job and remove_exited_jobs:
                remove_containers.append(mname)
            else:
                reasons.add('job-stopped' if is_job else 'member-stopped')
        elif state == MISSING:
            detach.append(mname)
        else:  # 'removing' or anything docker adds later: do not guess
            reasons.add('member-removing')
    for reason in _KEEP_ORDER:
        if reason in reasons:
            return SweepDecision('keep', job_id, reason)
    return SweepDecision('remove', job_id, None, detach=sorted(set(detach)),
                         remove_containers=sorted(set(remove_containers)))


def _container_name(summary):
    names = summary.get('Names') or []
    return names[0].lstrip('/') if names else summary.get('Id', '')[:12]


def members_of(net_attrs, containers):
    """[{'name', 'state'}] on a network, from the container list and its inspect.

    A stopped or created container is configured on a network without being
    in the network's own ``Containers`` (which lists active endpoints only),
    so membership comes from each container's ``NetworkSettings``; an active
    endpoint with no container behind it is reported as 'missing'.
    """
    name = net_attrs.get('Name')
    net_id = net_attrs.get('Id')
    seen = set()
    out = []
    for summary in containers:
        nets = ((summary.get('NetworkSettings') or {}).get('Networks') or {})
        hit = name in nets or any((v or {}).get('NetworkID') == net_id for v in nets.values() if net_id)
        if hit:
            seen.add(summary.get('Id'))
            out.append(dict(name=_container_name(summary), state=(summary.get('State') or '').lower()))
    for cid, endpoint in (net_attrs.get('Containers') or {}).items():
        if cid not in seen:
            out.append(dict(name=(endpoint or {}).get('Name') or cid, state=MISSING))
    return sorted(out, key=lambda m: m['name'])


def _resolve_missing(client, members):
    """Re-read an active endpoint the container listing did not show.

    The containers are listed once, before the networks are inspected, so a
    job container started in between shows up only as an endpoint. Treating
    it as stale would detach a live job: ask the daemon about that one
    container instead (an extra inspect only in that rare case).
    """
    out = []
    for member in members:
        if member.get('state') == MISSING:
            try:
                info = client.api.inspect_container(member['name'])
                state = ((info.get('State') or {}).get('Status') or 'unknown').lower()
                member = dict(name=(info.get('Name') or member['name']).lstrip('/'), state=state)
            except Exception as exc:
                if not _is_not_found(exc):
                    member = dict(member, state='unknown')
        out.append(member)
    return out


def network_created(net_attrs):
    labels = net_attrs.get('Labels') or {}
    created = parse_time(labels.get(LABEL_CREATED))
    if created is None:
        created = parse_time(net_attrs.get('Created'))
    return created


def sweep(client, min_age=300, remove_exited_jobs=False, proxy_name=PROXY_NAME, id_prefix='',
          check_mode=False, now=None):
    """Collect job networks a dead worker left behind.

    Returns dict(removed=[...], kept=[...], failed=[...], changed=bool).
    Every candidate is in exactly one list: removed (with what was detached
    and which exited job containers were removed first; in check mode what
    would be), kept (a fixed reason from KEEP_REASONS and the members), or
    failed (the step and the daemon's message).
    """
    validate_id_prefix(id_prefix)
    try:
        min_age = int(min_age or 0)
    except (TypeError, ValueError):
        raise JobNetError('min_age %r is not a number of seconds; use e.g. 300.' % (min_age,))
    if min_age < 0:
        raise JobNetError('min_age %d is negative; use 0 (no minimum) or a number of seconds.' % min_age)
    try:
        nets = client.api.networks()
    except Exception as exc:
        raise _engine_error('Listing networks failed', exc)
    candidates = [n for n in nets if looks_like_job_network(n.get('Name'))]
    if id_prefix:
        candidates = [n for n in candidates if n['Name'][len(NETWORK_PREFIX):].startswith(id_prefix)]
    result = dict(removed=[], kept=[], failed=[], changed=False)
    if not candidates:
        return result
    try:
        containers = client.api.containers(all=True)
    except Exception as exc:
        raise _engine_error('Listing containers failed', exc)
    now = time.time() if now is None else now
    for summary in sorted(candidates, key=lambda n: n['Name']):
        name = summary['Name']
        try:
            attrs = client.api.inspect_network(summary['Id'])
        except Exception as exc:
            if _is_not_found(exc):
                continue  # removed meanwhile by its own worker: not ours to report
            result['failed'].append(dict(network=name, job_id=job_id_from_network_name(name), step='inspect',
                                         message=str(_engine_error('docker network inspect %s' % name, exc)),
                                         done=[]))
            continue
        members = _resolve_missing(client, members_of(attrs, containers))
        decision = decide_sweep(name, attrs.get('Labels'), network_created(attrs), members, now, min_age,
                                proxy_name, remove_exited_jobs, id_prefix)
        if decision.action is None:
            continue
        if decision.action == 'keep':
            result['kept'].append(dict(network=name, job_id=decision.job_id, reason=decision.reason,
                                       members=members))
            continue
        entry = dict(network=name, job_id=decision.job_id, detached=list(decision.detach),
                     removed_containers=list(decision.remove_containers))
        if check_mode:
            result['removed'].append(entry)
            result['changed'] = True
            continue
        failure = _execute_removal(client, attrs['Id'], decision)
        if failure:
            step, message, done = failure
            result['failed'].append(dict(network=name, job_id=decision.job_id, step=step, message=message,
                                         done=done))
            result['changed'] = result['changed'] or bool(done)
        else:
            result['removed'].append(entry)
            result['changed'] = True
    return result


def _execute_removal(client, net_id, decision):
    """None on success, else (step, daemon message, actions already done)."""
    done = []
    for cname in decision.remove_containers:
        try:
            client.api.remove_container(cname)
            done.append('removed container %s' % cname)
        except Exception as exc:
            if not _is_not_found(exc):
                return ('remove-container %s' % cname, str(_engine_error('docker rm %s' % cname, exc)), done)
    for member in decision.detach:
        try:
            if _disconnect(client, member, net_id):
                done.append('detached %s' % member)
        except EngineError as exc:
            return ('detach %s' % member, str(exc), done)
    try:
        _remove_network(client, net_id)
    except EngineError as exc:
        return ('remove-network', str(exc), done)
    return None


# --------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------

ADMIT = 'admit'
PROXY_STOPPED = 'egress-proxy-stopped'
PROXY_MISSING = 'egress-proxy-missing'
ENGINE_UNAVAILABLE = 'engine-unavailable'
VERDICTS = (ADMIT, PROXY_STOPPED, PROXY_MISSING, ENGINE_UNAVAILABLE)


class Verdict(object):
    def __init__(self, verdict, retryable=False, state=None, message=''):
        self.verdict = verdict
        self.retryable = retryable
        self.state = state
        self.message = message

    @property
    def admitted(self):
        return self.verdict == ADMIT

    def as_dict(self):
        return dict(verdict=self.verdict, retryable=self.retryable, state=self.state, message=self.message)

    def __repr__(self):
        return 'Verdict(%r)' % (self.as_dict(),)


def verdict_for_state(state, proxy_name=PROXY_NAME):
    """The preflight's decision from the proxy's docker state (None = no such container). Pure."""
    if state is None:
        return Verdict(PROXY_MISSING, False, None,
                       'The egress proxy %s does not exist, so this job would reach nothing. Start it '
                       '(ansible-playbook pi_dispatch.egress.site, or pi-dispatch up), or switch the '
                       'egress policy off.' % proxy_name)
    if state == 'running':
        return Verdict(ADMIT, False, state, 'The egress proxy %s is running.' % proxy_name)
    fix = ('docker unpause %s' % proxy_name if state == 'paused'
           else 'docker start %s' % proxy_name)
    return Verdict(PROXY_STOPPED, False, state,
                   'The egress proxy %s is %s, so this job would reach nothing. Start it (%s, or '
                   'ansible-playbook pi_dispatch.egress.site).' % (proxy_name, state, fix))


def preflight(client, proxy_name=PROXY_NAME, enabled=True):
    """The verdict before a job spends anything; one container inspect.

    ``client`` is a DockerClient, or a zero-argument callable returning one
    (called only when the policy is on). With ``enabled`` false the verdict is
    admit and the daemon is not touched. A daemon that does not answer gives
    ``engine-unavailable`` with retryable=True: nothing was decided.
    """
    if not enabled:
        return Verdict(ADMIT, False, None, 'The egress policy is off; the daemon was not asked.')
    try:
        if callable(client) and not hasattr(client, 'containers'):
            client = client()
        container = get_container(client, proxy_name)
    except EngineError as exc:
        return Verdict(ENGINE_UNAVAILABLE, True, None,
                       'The Docker Engine did not answer about %s (%s). Nothing was decided; retry the '
                       'job later.' % (proxy_name, exc))
    except Exception as exc:  # a client that cannot even be built
        return Verdict(ENGINE_UNAVAILABLE, True, None,
                       'The Docker Engine did not answer about %s (%s). Nothing was decided; retry the '
                       'job later.' % (proxy_name, exc))
    if container is None:
        return verdict_for_state(None, proxy_name)
    state = ((container.attrs or {}).get('State') or {}).get('Status') or getattr(container, 'status', None)
    return verdict_for_state((state or 'unknown').lower(), proxy_name)


# --------------------------------------------------------------------------
# Reporting and clients for the adapters
# --------------------------------------------------------------------------

def sweep_lines(result, check_mode=False):
    """One line per network of a :func:`sweep` result (removed, kept, failed)."""
    verb = 'would remove' if check_mode else 'removed'
    lines = []
    for entry in result.get('removed', []):
        extra = []
        if entry.get('removed_containers'):
            extra.append('removing %s' % ', '.join(entry['removed_containers']))
        if entry.get('detached'):
            extra.append('detaching %s' % ', '.join(entry['detached']))
        lines.append('%s %s%s' % (verb, entry['network'], ' (after %s)' % ' and '.join(extra) if extra else ''))
    for entry in result.get('kept', []):
        lines.append('kept %s: %s (%s)' % (entry['network'], entry['reason'],
                                           KEEP_REASONS.get(entry['reason'], entry['reason'])))
    for entry in result.get('failed', []):
        lines.append('failed %s at %s: %s' % (entry['network'], entry['step'], entry['message']))
    return lines


def lazy_client(docker_host=None, timeout=60):
    """A zero-argument callable building a DockerClient without a ping.

    For :func:`preflight`: the only call that must reach the daemon is the
    one inspect. (The SDK still asks the daemon's API version once while it
    builds the client; a runner that keeps one client pays that once.)
    """
    def build():
        import docker
        if docker_host:
            return docker.DockerClient(base_url=docker_host, timeout=timeout)
        return docker.from_env(timeout=timeout)
    return build
