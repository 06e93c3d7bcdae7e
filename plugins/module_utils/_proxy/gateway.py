# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The transparent gateway container (docs/transparent.md): its wanted shape and its start.

One gateway per deployment, beside the proxy: on the proxy's upstream network, attached to every
transparent job network by the job-network API. It is the only part of the egress layer that holds
``NET_ADMIN`` (with SETUID/SETGID/SETPCAP to drop them): its entrypoint applies the packet filter
as root, then runs the resolver and the relays as the user ``pigw`` with no capability. The
deployment folder's allowlist, model endpoints and guard are mounted read-only, file by file, as
the proxy mounts them.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from typing import Any, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import (
    EngineError, api_message, is_not_found)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment

GATEWAY_NAME = 'pi-dispatch-egress-gateway'
GATEWAY_IMAGE = 'pi-dispatch-egress-gateway:latest'
LABEL_ROLE = 'io.pi-dispatch.egress.role'
ROLE = 'gateway'
LABEL_PROXY = 'io.pi-dispatch.egress.gateway-of'
# NET_ADMIN: the packet filter and the per-name addresses; SETUID/SETGID/SETPCAP: the entrypoint's drop to
# pigw; KILL: the root commands signal pid 1 (pigw). The resolver and relays hold none of them.
CAPS = ['NET_ADMIN', 'SETUID', 'SETGID', 'SETPCAP', 'KILL']
GATEWAYD = '/usr/lib/pi-dispatch/gatewayd'
# Open files of the gateway (its listeners, and two per relayed connection: 256 per job at most): bounded as
# the proxy's are, so a flood of opted-in ports or connections cannot take the host's descriptors.
NOFILE = 16384
NETS_DIR = '/var/lib/pi-gateway/nets'
# The root control socket (``gatewayd control``): a folder of the deployment folder, mode 0700, bind-mounted
# at CONTROL_DIR; the job-network API configures and forgets a network through it (no docker exec per
# network). On no network: only root on the host reaches it.
CONTROL_DIR = '/run/pi-gateway-control'
CONTROL_SOCKET = 'control.sock'
CONTROL_HOST_DIR = 'gateway-control'
CONTROL_LIMIT = 65536
CONTROL_TIMEOUT = 30.0
# sun_path holds 108 bytes with its NUL: a longer path is connected to through its folder's descriptor
# (/proc/self/fd/<n>/<socket>, _connect), so a deployment folder deep in the file system keeps the socket.
SUN_PATH_MAX = 107
# What the gateway reads of the deployment folder, and where.
MOUNTS = (
    (_deployment.ALLOWLIST, '/etc/pi-dispatch/egress-allowlist.conf'),
    (_deployment.ENDPOINTS_JSON, '/etc/pi-dispatch/model-endpoints.json'),
    (_deployment.GUARD_CONF, '/etc/pi-dispatch/egress-guard.conf'),
)


class GatewayError(EngineError):
    """The gateway could not be started or told about a job network."""


def control_dir(deploy_dir: str, name: str = GATEWAY_NAME) -> str:
    """The host folder of the gateway ``name``'s control socket (pure)."""
    return os.path.join(os.path.realpath(deploy_dir), CONTROL_HOST_DIR, name)


def prepare_control_dir(path: str) -> None:
    """Make ``path`` (and its parent) a folder of this user, mode 0700, no link; GatewayError when it cannot be."""
    for folder in (os.path.dirname(path), path):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise GatewayError('Cannot create %s (the gateway\'s control socket folder): %s. Nothing was changed.'
                               % (folder, exc))
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise GatewayError('%s is not a folder of uid %d (a link, a file, or another owner\'s): the gateway\'s '
                               'control socket is not put there. Remove it and run again. Nothing was changed.'
                               % (folder, os.geteuid()))
        if st.st_mode & 0o077:
            os.chmod(folder, 0o700)


def desired(deploy_dir: str, upstream_network: str, proxy_name: str, image: str = GATEWAY_IMAGE,
            name: str = GATEWAY_NAME, dns: Optional[List[str]] = None) -> Dict[str, Any]:
    """The gateway container's wanted shape (pure)."""
    binds = {}
    for rel, target in MOUNTS:
        source = os.path.realpath(os.path.join(deploy_dir, rel))
        binds[source] = dict(bind=target, mode='ro')
    # The job networks' files outlive the container: a recreated gateway (an upgrade) applies them again.
    binds[name + '-nets'] = dict(bind=NETS_DIR, mode='rw')
    binds[control_dir(deploy_dir, name)] = dict(bind=CONTROL_DIR, mode='rw')
    return dict(
        name=name, image=image, network=upstream_network, binds=binds, dns=list(dns or []),
        labels={LABEL_ROLE: ROLE, LABEL_PROXY: proxy_name},
        cap_drop=['ALL'], cap_add=list(CAPS), security_opt=['no-new-privileges'],
        sysctls={'net.ipv4.ip_forward': '0', 'net.ipv4.conf.all.forwarding': '0'},
        restart_policy={'Name': 'unless-stopped'}, pids_limit=256, mem_limit='256m',
        ulimits=[dict(name='nofile', soft=NOFILE, hard=NOFILE)])


def _inspect(client: Any, name: str) -> Optional[Dict[str, Any]]:
    try:
        return client.api.inspect_container(name)
    except Exception as exc:
        if is_not_found(exc) or getattr(getattr(exc, 'response', None), 'status_code', None) == 404:
            return None
        raise GatewayError('Inspecting %s failed: %s' % (name, api_message(exc)))


def job_attachments(attrs: Dict[str, Any], upstream: str) -> Dict[str, str]:
    """{job network: the gateway's IPv4 address on it} of an inspect (every network but the upstream one)."""
    out = {}
    for net, endpoint in ((attrs.get('NetworkSettings') or {}).get('Networks') or {}).items():
        if net != upstream and (endpoint or {}).get('IPAddress'):
            out[net] = endpoint['IPAddress']
    return out


def differences(spec: Dict[str, Any], attrs: Dict[str, Any], image_id: Optional[str]) -> List[str]:
    """Why a running gateway is not the wanted one (empty: it is)."""
    out = []
    if image_id and attrs.get('Image') != image_id:
        out.append('image %s was rebuilt' % spec['image'])
    host = attrs.get('HostConfig') or {}
    if sorted(host.get('CapAdd') or []) != sorted(spec['cap_add']):
        out.append('capabilities %s, wanted %s' % (sorted(host.get('CapAdd') or []), sorted(spec['cap_add'])))
    have_ulimits = sorted((u.get('Name'), u.get('Soft'), u.get('Hard')) for u in host.get('Ulimits') or [])
    want_ulimits = sorted((u['name'], u['soft'], u['hard']) for u in spec.get('ulimits') or [])
    if have_ulimits != want_ulimits:
        out.append('ulimits %s, wanted %s' % (have_ulimits, want_ulimits))
    have = sorted('%s:%s' % (m.get('Source') if m.get('Type') == 'bind' else m.get('Name'), m.get('Destination'))
                  for m in attrs.get('Mounts') or [])
    want = sorted('%s:%s' % (src, b['bind']) for src, b in spec['binds'].items())
    if have != want:
        out.append('mounts %s, wanted %s' % (have, want))
    return out


def ensure(client: Any, spec: Dict[str, Any], check_mode: bool = False, allow_cut_jobs: bool = False
           ) -> Dict[str, Any]:
    """Create and start the gateway when it is missing, stopped or not the wanted one; dict(changed, actions,
    differences).

    A gateway whose image was rebuilt (or whose shape differs) is recreated: every job network it was on
    is attached again at the same address (each job resolves through that address), and the networks'
    files (a named volume) are applied again. The recreate cuts the connections its relays hold open, so
    while it carries transparent job networks it is refused unless ``allow_cut_jobs`` (the proxy's
    consent rule). An existing container of that name that is not a gateway is refused, naming it.
    """
    api = client.api
    actions = []
    attrs = _inspect(client, spec['name'])
    if attrs is not None and (attrs['Config'].get('Labels') or {}).get(LABEL_ROLE) != ROLE:
        raise GatewayError('A container named %s exists and is not a pi-dispatch gateway (no label %s=%s). '
                           'Nothing was changed. Rename or remove it, or choose another gateway name.'
                           % (spec['name'], LABEL_ROLE, ROLE))
    try:
        image_id = api.inspect_image(spec['image'])['Id']
    except Exception as exc:
        raise GatewayError('The gateway image %s is not on the daemon (%s). Build it first (the proxy role does '
                           'with egress_gateway_enabled; docs/transparent.md). Nothing was changed.'
                           % (spec['image'], api_message(exc)))
    diffs = differences(spec, attrs, image_id) if attrs is not None else []
    reattach = {}  # type: Dict[str, str]
    if diffs:
        reattach = job_attachments(attrs, spec['network'])
        if reattach and not allow_cut_jobs:
            raise GatewayError(
                'The gateway %s differs from the wanted one (%s), and recreating it cuts the open connections of '
                'the %d transparent job networks it carries (%s). Nothing was changed. Consent with '
                'egress_proxy_allow_cut_jobs=true (egress_upgrade_allow_cut_jobs for upgrade.yml; allow_cut_jobs '
                'for the module), or run it when no transparent job runs.'
                % (spec['name'], '; '.join(diffs), len(reattach), ', '.join(sorted(reattach))))
        actions.append('recreate %s (%s)' % (spec['name'], '; '.join(diffs)))
        if check_mode:
            return dict(changed=True, actions=actions, differences=diffs)
        try:
            api.remove_container(spec['name'], force=True)
        except Exception as exc:
            raise GatewayError('Removing the old gateway %s failed: %s' % (spec['name'], api_message(exc)))
        attrs = None
    if attrs is None and check_mode:
        return dict(changed=True, actions=actions or ['create %s' % spec['name']], differences=diffs)
    if attrs is None:
        for source, bind in spec['binds'].items():
            if bind['mode'] == 'ro' and not os.path.isfile(source):
                raise GatewayError('%s is missing: the gateway mounts it. Lay out the deployment folder first '
                                   '(playbooks/site.yml). Nothing was changed.' % source)
        for source, bind in spec['binds'].items():
            if bind['bind'] == CONTROL_DIR:
                prepare_control_dir(source)
        host_config = api.create_host_config(
            binds=spec['binds'], network_mode=spec['network'], cap_drop=spec['cap_drop'], cap_add=spec['cap_add'],
            security_opt=spec['security_opt'], sysctls=spec['sysctls'], restart_policy=spec['restart_policy'],
            pids_limit=spec['pids_limit'], mem_limit=spec['mem_limit'], dns=spec['dns'] or None,
            ulimits=spec.get('ulimits') or None)
        try:
            api.create_container(spec['image'], name=spec['name'], labels=spec['labels'], host_config=host_config,
                                 detach=True)
        except Exception as exc:
            raise GatewayError('Creating the gateway %s (image %s) failed: %s. Build the image first '
                               '(tests/images/build.yml builds it; docs/transparent.md).'
                               % (spec['name'], spec['image'], api_message(exc)))
        if not diffs:
            actions.append('create %s' % spec['name'])
        for net, address in sorted(reattach.items()):
            try:
                api.connect_container_to_network(spec['name'], net, ipv4_address=address)
            except Exception as exc:
                raise GatewayError('Attaching the new gateway to %s at %s failed: %s. The jobs on that network '
                                   'resolve nothing until it is; tear the network down and create it again.'
                                   % (net, address, api_message(exc)))
        attrs = api.inspect_container(spec['name'])
    if not attrs['State'].get('Running'):
        if check_mode:
            return dict(changed=True, actions=['start %s' % spec['name']], differences=diffs)
        try:
            api.start(spec['name'])
        except Exception as exc:
            raise GatewayError('Starting the gateway %s failed: %s' % (spec['name'], api_message(exc)))
        actions.append('start %s' % spec['name'])
    return dict(changed=bool(actions), actions=actions, differences=diffs)


def _remove_volume(client: Any, name: str, actions: List[str], check_mode: bool) -> None:
    """Remove the gateway's ``<name>-nets`` volume (its per-network files; nothing is left to apply)."""
    volume = name + '-nets'
    try:
        client.api.inspect_volume(volume)
    except Exception as exc:
        if is_not_found(exc):
            return
        raise GatewayError('Inspecting the volume %s failed: %s' % (volume, api_message(exc)))
    actions.append('remove volume %s' % volume)
    if not check_mode:
        try:
            client.api.remove_volume(volume)
        except Exception as exc:
            if not is_not_found(exc):
                raise GatewayError('Removing the volume %s failed: %s. The gateway itself is gone; docker volume '
                                   'rm %s' % (volume, api_message(exc), volume))


def remove(client: Any, name: str, check_mode: bool = False) -> Dict[str, Any]:
    """Remove the gateway (state=absent) and its ``<name>-nets`` volume; refused while a job network still has it."""
    attrs = _inspect(client, name)
    if attrs is None:
        actions: List[str] = []
        _remove_volume(client, name, actions, check_mode)  # left by a removal that stopped half-way
        return dict(changed=bool(actions), actions=actions, differences=[])
    if (attrs['Config'].get('Labels') or {}).get(LABEL_ROLE) != ROLE:
        raise GatewayError('%s is not a pi-dispatch gateway; not removed.' % name)
    upstream = (attrs.get('HostConfig') or {}).get('NetworkMode') or ''
    jobs = sorted(job_attachments(attrs, upstream))
    if jobs:
        raise GatewayError('The gateway %s still carries the transparent job networks %s. Nothing was removed. '
                           'Tear them down first (job_network state=absent, or job_network_gc).'
                           % (name, ', '.join(jobs)))
    sockets = [os.path.join(m['Source'], CONTROL_SOCKET) for m in attrs.get('Mounts') or []
               if m.get('Destination') == CONTROL_DIR and m.get('Type') == 'bind' and m.get('Source')]
    if not check_mode:
        try:
            client.api.remove_container(name, force=True)
        except Exception as exc:
            raise GatewayError('Removing the gateway %s failed: %s' % (name, api_message(exc)))
        for path in sockets:  # its control socket folder (nothing else is in it)
            for clean in (os.unlink, os.rmdir):
                try:
                    clean(path if clean is os.unlink else os.path.dirname(path))
                except OSError:
                    pass
    actions = ['remove %s' % name]
    _remove_volume(client, name, actions, check_mode)
    return dict(changed=True, actions=actions, differences=[])


def exec_gatewayd(client: Any, name: str, argv: List[str]) -> str:
    """Run ``gatewayd <argv>`` in the gateway as root; its stdout, or GatewayError with its words."""
    api = client.api
    try:
        handle = api.exec_create(name, ['python3', GATEWAYD] + list(argv), user='root')
        out = api.exec_start(handle['Id'])
        code = api.exec_inspect(handle['Id']).get('ExitCode')
    except Exception as exc:
        raise GatewayError('Running gatewayd %s in %s failed: %s' % (' '.join(argv), name, api_message(exc)))
    text = (out or b'').decode('utf-8', 'replace')
    if code != 0:
        raise GatewayError('gatewayd %s in %s exited %s: %s' % (' '.join(argv), name, code, text.strip()[-800:]))
    return text


def control_socket(client: Any, name: str) -> Optional[str]:
    """The host path of the gateway ``name``'s control socket, or None (a gateway made before it had one)."""
    attrs = _inspect(client, name)
    for mount in (attrs or {}).get('Mounts') or []:
        if mount.get('Destination') == CONTROL_DIR and mount.get('Type') == 'bind' and mount.get('Source'):
            return os.path.join(mount['Source'], CONTROL_SOCKET)
    return None


def _connect(sock: socket.socket, path: str) -> None:
    """Connect ``sock`` to the Unix socket at ``path``, however long the path: one longer than sun_path is
    reached through an ``O_PATH`` descriptor of its folder (``/proc/self/fd/<n>/<name>``, the same inode)."""
    if len(path.encode('utf-8')) <= SUN_PATH_MAX:
        sock.connect(path)
        return
    folder = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.connect('/proc/self/fd/%d/%s' % (folder, os.path.basename(path)))
    finally:
        os.close(folder)


def control_request(path: Optional[str], name: str, request: Dict[str, Any], timeout: float = CONTROL_TIMEOUT
                    ) -> Optional[Dict[str, Any]]:
    """Send one request to the gateway's control socket at ``path``; its answer (``ok`` true).

    None when no control socket answers there (no path, no socket, nobody listening): the caller uses
    ``docker exec`` instead. GatewayError when the gateway refused the request
    or failed doing it (its words), or the exchange broke half-way; nothing is retried then.
    """
    if not path:
        return None
    data = json.dumps(request, sort_keys=True).encode('utf-8')
    if len(data) > CONTROL_LIMIT:
        raise GatewayError('The request for the gateway %s is %d bytes, more than its control socket takes (%d). '
                           'Nothing was sent.' % (name, len(data), CONTROL_LIMIT))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            _connect(sock, path)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        except OSError as exc:
            raise GatewayError('Connecting to the control socket %s of the gateway %s failed: %s. Only root may use '
                               'it.' % (path, name, exc))
        chunks = []
        try:
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before it read the request (the peer's uid): its answer says why
            size = 0
            while size <= (1 << 20):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise GatewayError('The control socket of the gateway %s broke off (%s); docker logs %s shows why.'
                               % (name, exc or type(exc).__name__, name))
    finally:
        sock.close()
    try:
        reply = json.loads(b''.join(chunks).decode('utf-8'))
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise GatewayError('The gateway %s gave no answer on its control socket (docker logs %s shows why).'
                           % (name, name))
    if reply.get('ok') is not True:
        raise GatewayError('The gateway %s refused %s: %s' % (name, request.get('op'), reply.get('error')))
    return reply
