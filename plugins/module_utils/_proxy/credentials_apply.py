# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""What ``egress_credentials`` does with a client (docs/credentials.md).

1. Read ``egress-credentials.json`` (created empty when missing), every bound host checked against the
   allowlist; a refused declaration changes nothing.
2. With nothing declared: remove an interceptor this collection made; the proxy then runs without the
   include (the proxy role passes none).
3. Otherwise, in the deployment folder's ``credentials/``: the interceptor's configuration (never a secret
   value), the jobs' records folder and the CA folder, each root-only. Then the interceptor's network, the
   interceptor (recreated when its image or shape changed), and the TLS name check's include, rendered with
   that network's subnet and written in place. A running proxy that already mounts the include rereads it.

The secret files are checked and each problem reported, naming the credential and the file, never a byte
of the file; they do not stop the deployment (the preflight refuses a job whose secret is unusable).
Here, not in ``_policy/``, because it starts containers and reloads the proxy.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import allowlist as _allowlist
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import interceptor as _interceptor
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _spec

FOLDER = 'credentials'
CA_WAIT_S = 30


class CredentialsDeployError(dc.EngineError):
    """The interceptor could not be made as wanted; the message says what was left and how to fix it."""


def listed_by(allowlist_text: str, path: str) -> Callable[[str], bool]:
    """A host is listed when an entry names it exactly or a leading-dot entry covers it (squid's dstdomain)."""
    return _decisions.Matcher(_allowlist.parse(allowlist_text, path).hosts()).covers


def paths(deploy_dir: str) -> Dict[str, str]:
    base = os.path.join(deploy_dir, FOLDER)
    return dict(declaration=os.path.join(deploy_dir, _credentials.FILE_NAME), folder=base,
                conf=os.path.join(base, 'conf'), config=os.path.join(base, 'conf', 'credentials.json'),
                upstream_ca=os.path.join(base, 'conf', 'upstream-ca.pem'), jobs=os.path.join(base, 'jobs'),
                ca=os.path.join(base, 'ca'), ca_cert=os.path.join(base, 'ca', _interceptor.CA_CERT),
                include=os.path.join(deploy_dir, _interceptor.INCLUDE_NAME),
                allowlist=os.path.join(deploy_dir, _deployment.ALLOWLIST))


def _ensure_dir(path: str, actions: List[str], check_mode: bool) -> None:
    if os.path.islink(path):
        raise CredentialsDeployError('%s is a symlink; the credential folders must be real folders. Nothing was '
                                     'changed past this point; remove the link.' % path)
    if not os.path.isdir(path):
        actions.append('create folder %s' % path)
        if not check_mode:
            os.makedirs(path, mode=0o700)
    if not check_mode:
        os.chmod(path, 0o700)


def _write_if_changed(path: str, text: str, actions: List[str], check_mode: bool, in_place: bool = False) -> bool:
    try:
        with open(path) as handle:
            if handle.read() == text:
                return False
    except FileNotFoundError:
        pass
    actions.append('write %s' % path)
    if not check_mode:
        if in_place and os.path.exists(path):
            _files.write_in_place(path, text)   # the proxy mounts this file: keep its inode
        else:
            _files.write_atomic(path, text)
    return True


def _inspect(client: Any, name: str) -> Optional[Dict[str, Any]]:
    return dc.read('inspect container %s' % name, lambda: client.api.inspect_container(name), missing=True)


def differences(kwargs: Dict[str, Any], attrs: Dict[str, Any], image_id: Optional[str]) -> List[str]:
    """Why a running interceptor is not the wanted one (empty: it is)."""
    out = []
    if image_id and attrs.get('Image') != image_id:
        out.append('image %s was rebuilt' % kwargs['image'])
    have = sorted('%s:%s:%s' % (m.get('Source'), m.get('Destination'), 'rw' if m.get('RW') else 'ro')
                  for m in attrs.get('Mounts') or [])
    want = sorted('%s:%s:%s' % (src, b['bind'], b['mode']) for src, b in kwargs['volumes'].items())
    if have != want:
        out.append('mounts %s, wanted %s' % (have, want))
    env = dict(item.split('=', 1) for item in (attrs.get('Config') or {}).get('Env') or [] if '=' in item)
    for key, value in kwargs['environment'].items():
        if env.get(key) != value:
            out.append('%s=%s, wanted %s' % (key, env.get(key), value))
    if 'PI_INTERCEPTOR_UPSTREAM_CA' in env and 'PI_INTERCEPTOR_UPSTREAM_CA' not in kwargs['environment']:
        out.append('PI_INTERCEPTOR_UPSTREAM_CA set, wanted unset')
    host = attrs.get('HostConfig') or {}
    for label, key, have_key in (('memory', 'mem_limit', 'Memory'), ('pids limit', 'pids_limit', 'PidsLimit')):
        if key in kwargs and (host.get(have_key) or 0) != kwargs[key]:
            out.append('%s %s, wanted %s' % (label, host.get(have_key) or 'unbounded', kwargs[key]))
    return out


class CredentialsDeploy(object):
    """One run of egress_credentials: :meth:`run` fills ``result``."""

    def __init__(self, client: Any, params: Dict[str, Any], check_mode: bool = False) -> None:
        self.client = client
        self.params = params
        self.check_mode = check_mode
        self.paths = paths(params['deploy_dir'])
        self.actions: List[str] = []
        self.warnings: List[str] = []
        self.result: Dict[str, Any] = dict(changed=False, actions=self.actions, declared=[], include=None,
                                           ca_cert=None, secret_problems=[], work=False)

    def _declaration(self) -> List[_credentials.Credential]:
        p = self.paths
        with open(p['allowlist']) as handle:
            listed = listed_by(handle.read(), p['allowlist'])
        creds, _path, exists = _credentials.load(self.params['deploy_dir'], listed=listed)
        if not exists:
            self.actions.append('create %s (empty: nothing declared)' % p['declaration'])
            if not self.check_mode:
                _files.create_exclusive(p['declaration'], _credentials.EMPTY_DECLARATION, mode=0o644)
        return creds

    def _remove_interceptor(self) -> None:
        attrs = _inspect(self.client, self.params['name'])
        if attrs is None:
            return
        if (attrs['Config'].get('Labels') or {}).get(_interceptor.LABEL_ROLE) != _interceptor.ROLE:
            raise CredentialsDeployError('A container named %s exists and is not a pi-dispatch credential '
                                         'interceptor; not removed.' % self.params['name'])
        self.actions.append('remove %s (no credential declared)' % self.params['name'])
        if not self.check_mode:
            self.client.api.remove_container(self.params['name'], force=True)

    def _network_subnet(self) -> Optional[str]:
        name = self.params['network']
        net = dc.get_network(self.client, name)
        if net is None:
            self.actions.append('create network %s (--internal)' % name)
            if self.check_mode:
                return None
            net = self.client.networks.create(name, driver='bridge', internal=True,
                                              labels={_spec.LABEL_NETWORK_ROLE: 'credentials'})
            net.reload()
        elif not (net.attrs or {}).get('Internal'):
            raise CredentialsDeployError('The network %s exists and is not --internal: the interceptor must reach '
                                         'nothing but the proxy. Nothing was changed past this point; remove the '
                                         'network.' % name)
        config = ((net.attrs.get('IPAM') or {}).get('Config') or [{}])[0]
        return config.get('Subnet')

    def _kwargs(self, creds: List[_credentials.Credential]) -> Dict[str, Any]:
        p, params = self.paths, self.params
        return _interceptor.container_kwargs(
            params['image'], p['conf'], p['jobs'], p['ca'], [c.secret_file for c in creds],
            upstream='http://%s:%d' % (params['proxy_name'], _interceptor.RETURN_PORT), name=params['name'],
            network=params['network'], upstream_ca=bool(params.get('upstream_ca')))

    def _image_id(self) -> str:
        try:
            return self.client.api.inspect_image(self.params['image'])['Id']
        except Exception as exc:
            raise CredentialsDeployError('The interceptor image %s is not on the daemon (%s). Build it first (the '
                                         'proxy role does when a credential is declared). Nothing was started.'
                                         % (self.params['image'], dc.api_message(exc)))

    def _diffs(self, creds: List[_credentials.Credential], attrs: Dict[str, Any]) -> List[str]:
        """Why the existing interceptor (``attrs``) must be recreated; empty: it is the wanted one."""
        if (attrs['Config'].get('Labels') or {}).get(_interceptor.LABEL_ROLE) != _interceptor.ROLE:
            raise CredentialsDeployError('A container named %s exists and is not a pi-dispatch credential '
                                         'interceptor. Rename or remove it.' % self.params['name'])
        diffs = differences(self._kwargs(creds), attrs, self._image_id())
        if not os.path.exists(self.paths['ca_cert']):
            # The documented CA rotation: the folder was emptied; a new interceptor makes a new CA.
            diffs.append('no CA certificate in %s (a new CA is made)' % self.paths['ca'])
        return diffs

    def _consent(self, creds: List[_credentials.Credential]) -> None:
        """Refuse, before anything is written, to replace or remove a running interceptor while job networks are
        attached to the proxy family (their connections to bound hosts drop), unless ``allow_cut_jobs``."""
        name = self.params['name']
        attrs = _inspect(self.client, name)
        if attrs is None or not (attrs.get('State') or {}).get('Running') or self.params.get('allow_cut_jobs'):
            return
        if creds:
            diffs = self._diffs(creds, attrs)
            if not diffs:
                return
            step = 'replacement of %s (%s)' % (name, '; '.join(diffs))
        else:
            if (attrs['Config'].get('Labels') or {}).get(_interceptor.LABEL_ROLE) != _interceptor.ROLE:
                return  # not ours: _remove_interceptor refuses it by name
            step = 'removal of %s (no credential declared)' % name
        family = [m for m in _shards.members(self.client, self.params['proxy_name']) if m.running and m.load]
        cut = sum(m.load for m in family)
        if not cut:
            return
        message = ('Refused, nothing changed: the %s would cut the connections to bound hosts of the %d job network%s '
                   'attached to %s (%s). Set egress_proxy_allow_cut_jobs (allow_cut_jobs) to consent '
                   '(egress_upgrade_allow_cut_jobs for upgrade.yml), or wait until they end.'
                   % (step, cut, '' if cut == 1 else 's', ', '.join(m.name for m in family),
                      ', '.join(n for m in family for n in m.job_networks)))
        self.result['refused'] = message
        raise CredentialsDeployError(message)

    def _interceptor(self, creds: List[_credentials.Credential]) -> None:
        params = self.params
        kwargs = self._kwargs(creds)
        self._image_id()
        attrs = _inspect(self.client, params['name'])
        if attrs is not None:
            diffs = self._diffs(creds, attrs)
            if diffs:
                self.actions.append('recreate %s (%s)' % (params['name'], '; '.join(diffs)))
                if not self.check_mode:
                    self.client.api.remove_container(params['name'], force=True)
                attrs = None
            elif not attrs['State'].get('Running'):
                self.actions.append('start %s' % params['name'])
                if not self.check_mode:
                    self.client.api.start(params['name'])
        if attrs is None:
            if not any(a.startswith('recreate') for a in self.actions):
                self.actions.append('create %s' % params['name'])
            if self.check_mode:
                return
            image = kwargs.pop('image')
            self.client.containers.run(image, **kwargs)
        self._wait_ca()

    def _wait_ca(self) -> None:
        if self.check_mode:
            return
        end = time.monotonic() + CA_WAIT_S
        while not os.path.exists(self.paths['ca_cert']) and time.monotonic() < end:
            time.sleep(0.5)
        if not os.path.exists(self.paths['ca_cert']):
            logs = self.client.api.logs(self.params['name'], tail=20).decode('utf-8', 'replace')
            raise CredentialsDeployError('The interceptor %s made no CA certificate in %s within %d s. Its log:\n%s'
                                         % (self.params['name'], self.paths['ca'], CA_WAIT_S, logs))

    def _reload_proxy(self) -> None:
        """A running proxy that mounts the include rereads it (the TLS name check reconfigures when it changed)."""
        attrs = _inspect(self.client, self.params['proxy_name'])
        if attrs is None or not attrs['State'].get('Running'):
            return
        mounted = [m for m in attrs.get('Mounts') or [] if m.get('Destination') == _spec.CONTAINER_CREDENTIALS_INCLUDE]
        if not mounted:
            self.warnings.append('The proxy %s does not mount %s yet: the proxy role recreates it with the include '
                                 '(egress_proxy credentials_include).'
                                 % (self.params['proxy_name'], self.paths['include']))
            return
        self.actions.append('reload %s (the credential include changed)' % self.params['proxy_name'])
        if not self.check_mode:
            _reload.reload_family(self.client, self.client.containers.get(self.params['proxy_name']), None)

    def run(self) -> Dict[str, Any]:
        p = self.paths
        creds = self._declaration()
        self.result['declared'] = [dict(name=c.name, host=c.host, port=c.port, env=c.env, scheme=c.scheme,
                                        header=c.header) for c in creds]
        if self.params.get('inspect_only'):
            # Whether the run that follows has anything to do: something declared, or something to remove (an
            # interceptor's configuration or the include are on disk until a run with nothing declared removes
            # them, after the interceptor). Asks no daemon.
            self.result['work'] = bool(creds) or os.path.exists(p['include']) or os.path.exists(p['config'])
            return self._done()
        self._consent(creds)
        if not creds:
            self._remove_interceptor()
            # The include (the proxy role then runs the proxy without it; a proxy that mounts it is recreated),
            # then the interceptor's configuration: nothing is left for the next run to remove.
            for path in (p['include'], p['config']):
                if os.path.exists(path):
                    self.actions.append('remove %s (no credential declared)' % path)
                    if not self.check_mode:
                        os.unlink(path)
            return self._done()
        for cred in creds:
            problem = _credentials.check_secret(cred)
            if problem:
                self.result['secret_problems'].append(dict(name=cred.name, problem=problem))
                self.warnings.append(problem)
        for folder in (p['folder'], p['conf'], p['jobs'], p['ca']):
            _ensure_dir(folder, self.actions, self.check_mode)
        _write_if_changed(p['config'], json.dumps(_credentials.interceptor_config(creds), indent=2, sort_keys=True)
                          + '\n', self.actions, self.check_mode)
        if self.params.get('upstream_ca'):
            with open(self.params['upstream_ca']) as handle:
                _write_if_changed(p['upstream_ca'], handle.read(), self.actions, self.check_mode)
        subnet = self._network_subnet()
        self._interceptor(creds)
        if subnet is not None:
            text = _interceptor.render_include([c.host for c in creds], subnet, interceptor_host=self.params['name'])
            if _write_if_changed(p['include'], text, self.actions, self.check_mode, in_place=True):
                self._reload_proxy()
        self.result['include'] = p['include']
        self.result['ca_cert'] = p['ca_cert']
        return self._done()

    def _done(self) -> Dict[str, Any]:
        self.result['changed'] = bool(self.actions)
        return self.result
