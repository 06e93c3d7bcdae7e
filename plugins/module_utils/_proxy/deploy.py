# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The proxy's deployment: what egress_proxy does between its options and its result.

:func:`check_options` and :func:`wanted_spec` turn the module's parsed options into the wanted
shape (no daemon); :class:`ProxyDeploy` runs one deployment with a client: the refusals before
any action (a foreign container, symlinked or missing mounts, a refused allowlist, no image), the
differences (stale mounts included), the allowlist check, the decision, the shards that follow,
the consent, the actions and the health wait. It raises the collection's errors
(``ProxyError``, ``SourcesRefused``, ``EngineError``) and keeps the result so far in ``result``,
which the module passes to ``fail_json`` or ``exit_json``.
"""

from __future__ import annotations

import os
from typing import Any

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import docker_client as dc
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import venue as _venue
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import rules as _rules
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import lifecycle as _proxy
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import reload as _reload
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import rootless as _rootless
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import spec as _proxy_spec

# What the result reports of the container after a run that made or changed it.
CONTAINER_KEYS = ('id', 'name', 'status', 'health', 'networks', 'job_networks', 'mounts', 'published_ports',
                  'image_id', 'restart_policy', 'extra_hosts')
# Actions after which squid (re)starts, so the health wait applies.
STARTING_ACTIONS = ('create', 'start', 'restart', 'unpause', 'reconfigure')


def check_options(params: dict[str, Any]) -> None:
    """ProxyError for options that are wrong whatever the daemon holds (asked of nobody, nothing changed)."""
    for entry in params['extra_hosts']:
        if ':' not in entry or entry.startswith(':') or entry.endswith(':'):
            raise _proxy_spec.ProxyError('extra_hosts entry %r is not name:address' % entry)
    if params['health_interval'] < 1 or params['wait_timeout'] < 1:
        raise _proxy_spec.ProxyError('health_interval and wait_timeout must be at least 1 second')


def rules_write_decision_log(path: str) -> bool:
    """Whether the rules file at ``path`` writes the decision log (rules version 3); False when unreadable."""
    try:
        with open(path) as handle:
            return _rules.writes_decision_log(handle.read())
    except (IOError, OSError, UnicodeDecodeError):
        return False   # a missing rules file is refused later with its fix


def decision_log_settings(params: dict[str, Any], deploy_paths: dict[str, str] | None) -> dict[str, Any] | None:
    """The decision log's folder and rotation, or None: mounted only for rules that write it (version 3),
    so a proxy still on older rules keeps its shape."""
    if not (params['decision_log'] and deploy_paths and rules_write_decision_log(deploy_paths['rules'])):
        return None
    return dict(dir=params['decision_log_dir'] or os.path.join(params['deploy_dir'], _decisions.DEFAULT_FOLDER),
                max_size=params['decision_log_max_size'], keep=params['decision_log_keep'])


def wanted_spec(params: dict[str, Any], deploy_paths: dict[str, str] | None) -> dict[str, Any]:
    """The wanted container shape from the module's options (``spec.desired_spec``); ProxyError when refused."""
    paths = deploy_paths or {}
    limits = dict(memory=params['memory'], pids=params['pids_limit'], nofile=params['nofile'],
                  log_max_size=params['log_max_size'], log_max_file=params['log_max_file'])
    return _proxy_spec.desired_spec(
        params['image'], paths.get('rules', ''), paths.get('allowlist', ''), paths.get('endpoints_conf', ''),
        network=params['network'], name=params['name'], extra_hosts=params['extra_hosts'],
        health_interval=params['health_interval'], mount_endpoints=params['mount_endpoints'],
        guard=paths['guard_conf'] if paths and params['mount_endpoints'] else None, limits=limits,
        shard_bound=params['shard_bound'], decision_log=decision_log_settings(params, deploy_paths),
        credentials_include=params.get('credentials_include'), credentials_network=params.get('credentials_network'))


class Units(object):
    """The systemd units that run the proxy (option ``units``): the unit's name, how to write or remove the
    unit files (``write(state, check_mode)``, ``_podman/units_apply.apply``'s result) and ``systemctl``;
    ``manager`` is what ``systemctl`` and ``journalctl`` need to reach them (empty for the system's, ``--user -M
    <account>@`` for a service account's), for the messages that send an operator there."""

    def __init__(self, name: str, fmt: str, write: Any, systemctl: Any, manager: str = '') -> None:
        self.name, self.fmt, self.write, self.systemctl = name, fmt, write, systemctl
        self.manager = manager

    def journal(self) -> str:
        """The command that shows the unit's log."""
        return ' '.join(['journalctl'] + ([self.manager] if self.manager else []) + ['-u', self.name])


class ProxyDeploy(object):
    """One run of egress_proxy against a daemon: :meth:`run` fills ``result``; ``warnings`` are for the module."""

    def __init__(self, client: Any, params: dict[str, Any], spec: dict[str, Any],
                 deploy_paths: dict[str, str] | None, check_mode: bool = False, diff: bool = False,
                 units: Units | None = None) -> None:
        self.client = client
        self.params = params
        self.spec = spec
        self.deploy_paths = deploy_paths
        self.check_mode = check_mode
        self.diff = diff
        self.units = units
        self.manager = _proxy.ProxyManager(client, spec, check_mode=check_mode, unit=units.name if units else None,
                                           systemctl=units.systemctl if units else None,
                                           journal=units.journal() if units else None)
        self.result: dict[str, Any] = dict(
            changed=False, actions=self.manager.actions, differences=[], messages=self.manager.messages,
            container={}, allowlist_changed=False, stale_mounts=[], jobs_cut=0)

    @property
    def warnings(self) -> list[str]:
        return self.manager.warnings

    # --- before any action ---------------------------------------------------
    def check_ours(self, obs: dict[str, Any] | None) -> None:
        if obs and not _proxy_spec.is_ours(obs):
            raise _proxy_spec.ProxyError(
                'A container named %s exists but is not a pi-dispatch egress proxy (no %s label and no squid rules '
                'mount). Rename or remove it (docker rename / docker rm), or choose another name.'
                % (self.params['name'], _proxy_spec.LABEL_ROLE))

    def check_sources(self) -> str:
        """Refuse what squid must not start on (symlinks, missing mounts, a refused allowlist, no image);
        return the image's id."""
        for src, _dst in self.spec['mounts']:
            path = [v for v in self.deploy_paths.values() if os.path.realpath(v) == src]
            path = path[0] if path else src
            if os.path.islink(path):
                raise _proxy_spec.ProxyError('%s is a symlink; the proxy mounts it as a single file. Replace it '
                                             'with the real file. Nothing was changed.' % path)
        if self.spec.get('log_mount'):
            self.manager.check_log_dir()
        missing = self.manager.missing_sources()
        if missing:
            raise _proxy_spec.ProxyError(
                'Mount source(s) missing: %s. Lay out the deployment folder first (pi_dispatch.egress.egress_deployment'
                ' or playbooks/site.yml), which adds what is missing and changes nothing else.' % ', '.join(missing))
        self.check_engine_reach()
        if self.params['state'] not in ('stopped',):
            # squid reads the allowlist and the includes at every start and reconfigure: never ones
            # nobody validated (the reload path's own check, before any action).
            _reload.check_sources(self.deploy_paths, includes=('endpoints_conf', 'guard_conf')
                                  if self.params['mount_endpoints'] else ())
        image_id = self.manager.image_id()
        if image_id is None:
            raise _proxy_spec.ProxyError('Image %s is not on this daemon. Build it with the proxy role '
                                         '(playbooks/site.yml builds it locally; nothing is pulled).'
                                         % self.params['image'])
        return image_id

    def check_engine_reach(self) -> None:
        """Refuse mounts a rootless engine's account could not reach (_proxy/rootless.py), before any action:
        the engine would fail the create halfway, after the decision log folder was made."""
        ids = _rootless.engine_ids(self.client)
        if ids is None:
            return
        log_dir = self.spec['log_mount'][0] if self.spec.get('log_mount') else None
        refusal = _rootless.mount_refusal([src for src, _dst in self.spec['mounts']], log_dir, ids,
                                          proxy_uid=_proxy_spec.PROXY_UID)
        if refusal:
            raise _proxy_spec.ProxyError('%s. Nothing was changed.' % refusal)

    def stale_mounts(self, container: Any) -> list[str]:
        """Differences for mounted files saved by rename (a new inode the running proxy never sees)."""
        try:
            _rc, out = dc.exec_in(container, _reload.mounted_digests_cmd([d for _s, d in self.spec['mounts']]))
            stale = _reload.stale_mounts(self.spec, _reload.parse_digests(out))
        except dc.EngineError as exc:
            stale = []
            self.manager.messages.append('could not compare the mounted files with the proxy\'s view: %s' % exc)
        self.result['stale_mounts'] = [src for src, _dst in stale]
        return ['mounts: %s was replaced on disk (saved by rename, e.g. sed -i or an editor); the running proxy '
                'still reads the old file at %s, so the proxy is recreated to mount the new one' % (src, dst)
                for src, dst in stale]

    def allowlist_changed(self, container: Any) -> bool:
        """Whether the running squid read another allowlist than the mounted one (a hand edit)."""
        changed = False
        try:
            rc, _out = dc.exec_in(container, _reload.allowlist_check_cmd())
            changed = rc != 0
        except dc.EngineError as exc:
            self.manager.messages.append('could not compare the allowlist with what squid last read: %s' % exc)
        if changed:
            self.manager.messages.append('the allowlist differs from what squid last read (edited by hand, or '
                                         'never recorded): reconfigure, which cuts no job')
        return changed

    def refuse_without_consent(self, actions: list[str], obs: dict[str, Any] | None, plan: list[Any],
                               diffs: list[str], image_id: str | None) -> None:
        """ProxyError (``result['refused']``) when the actions would cut jobs without allow_cut_jobs."""
        p = self.params
        refusal = (_proxy.consent_refusal(actions, obs, p['allow_cut_jobs'])
                   or _proxy.shard_consent_refusal(plan, p['allow_cut_jobs']))
        if not refusal:
            return
        self.result['refused'] = True
        if self.diff and diffs:
            self.result['diff'] = _proxy_spec.shape_diff(self.spec, obs, image_id)
            self.result['diff']['after_header'] = '%s (wanted; refused: %s)' % (p['name'], refusal)
        raise _proxy_spec.ProxyError('%s What differs: %s' % (
            refusal, '; '.join(diffs) or 'nothing (%s asked)' % p['state']))

    # --- the run -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        p, result, manager = self.params, self.result, self.manager
        present = p['state'] != 'absent'
        container = manager.container()
        obs = _proxy_spec.observed(_venue.container_attrs(self.client, container.attrs)) if container else None
        self.check_ours(obs)
        image_id = self.check_sources() if present else None
        diffs = _proxy_spec.differences(self.spec, obs, image_id) if obs and present else []
        live = bool(obs and obs['running'] and not obs['paused'])
        if obs and live and present:
            diffs += self.stale_mounts(container)
        result['differences'] = diffs
        allowlist_changed = False
        if obs and not diffs and live and p['state'] in ('present', 'started'):
            allowlist_changed = self.allowlist_changed(container)
        result['allowlist_changed'] = allowlist_changed
        actions = _proxy.decide(p['state'], obs, diffs, allowlist_changed=allowlist_changed, upstream=p['network'])
        # The shards (clones of the proxy, _proxy/shard_clone.py) follow what the proxy does; each one's jobs count.
        plan = _shard_clone.follow_plan(_shards.members(self.client, p['name']), actions) if obs else []
        result['shards'] = [dict(name=m.name, action=step, jobs=m.load) for m, step in plan]
        result['jobs_cut'] = _proxy.jobs_cut(actions, obs) + _shard_clone.plan_jobs_cut(plan)
        self.refuse_without_consent(actions, obs, plan, diffs, image_id)
        if present:
            manager.ensure_network(internal=p['network_internal'])
            if manager.ensure_log_dir():
                result['changed'] = True
        if self.units and present:
            self.write_units('present')
        old_networks = _proxy.reattach_networks(obs, p['network'], self.spec.get('extra_networks')) if obs else []
        container = manager.apply(actions, container, old_networks)
        if self.units and not present:
            self.write_units('absent')
        if plan and not self.check_mode:
            self.follow_shards(plan)
        manager.actions.extend('%s shard %s' % (step, m.name) for m, step in plan)
        result['changed'] = bool(manager.actions)
        if self.diff and (diffs or (obs is None and 'create' in actions)):
            result['diff'] = _proxy_spec.shape_diff(self.spec, obs, image_id)
        if container is not None and not self.check_mode:
            self.settle(container, actions)
        elif obs and present:
            result['container'] = obs
        return result

    def write_units(self, state: str) -> None:
        """Write (or remove) the unit files when they differ, then make systemd read them: after the consent
        rule, before any step of the unit, so a refused step writes nothing and a restart runs the new file."""
        units = self.units
        done = units.write(state, self.check_mode)
        self.result['units'] = dict((key, done[key]) for key in ('units_dir', 'written', 'removed', 'units'))
        if not done['changed']:
            return
        self.manager.actions.append('write units' if state == 'present' else 'remove units')
        if self.check_mode:
            return
        self.result['changed'] = True  # written, even when a later step fails
        units.systemctl('daemon-reload')
        self.manager.messages.append('systemctl daemon-reload (%s)' % ', '.join(done['written'] or done['removed']))
        if units.fmt == 'systemd' and state == 'present':
            units.systemctl('enable', units.name)  # a Quadlet unit's [Install] section does this itself
            self.manager.messages.append('systemctl enable %s' % units.name)

    def follow_shards(self, plan: list[Any]) -> None:
        """Apply the shards' plan; ProxyError naming every shard that did not follow."""
        self.result['shards'] = _shard_clone.apply_plan(self.client, self.params['name'], plan)
        failed = [s for s in self.result['shards'] if s['error']]
        if failed:
            raise _proxy_spec.ProxyError(
                'The proxy is as wanted, but %d shard(s) did not follow it: %s. Rerun to retry them.'
                % (len(failed), '; '.join('%s (%s: %s)' % (s['name'], s['action'], s['error']) for s in failed)))

    def settle(self, container: Any, actions: list[str]) -> None:
        """Wait for health after a start (when asked), then report the container as it is now."""
        p = self.params
        if p['wait'] and set(actions) & set(STARTING_ACTIONS) and p['state'] not in ('stopped',):
            status = self.manager.wait_healthy(container, p['wait_timeout'])
            if status != 'healthy':
                if self.units:  # its container may be gone (--rm); the unit's journal has its log
                    raise _proxy_spec.ProxyError(
                        'The proxy did not become healthy within %ss (last status: %s). Its log: %s'
                        % (p['wait_timeout'], status, self.units.journal()))
                raise _proxy_spec.ProxyError('The proxy did not become healthy within %ss (last status: %s). '
                                             'Its log ends with:\n%s' % (p['wait_timeout'], status,
                                                                         _proxy.logs_tail(container)))
        container.reload()
        obs_after = _proxy_spec.observed(_venue.container_attrs(self.client, container.attrs))
        self.result['container'] = dict((k, obs_after[k]) for k in CONTAINER_KEYS)
        if self.units and p['state'] != 'stopped' and set(actions) & set(STARTING_ACTIONS):
            # The unit's file, not this module, gave the container its shape: one that still differs would
            # be replaced again on every run, so it is an error naming the unit.
            left = _proxy_spec.differences(self.spec, obs_after, self.manager.image_id())
            if left:
                raise _proxy_spec.ProxyError(
                    'systemd unit %s runs a proxy that is not the one wanted: %s. Its unit file was edited after '
                    'it was written, or another file overrides it (systemctl%s cat %s shows which)'
                    % (self.units.name, '; '.join(left), (' ' + self.units.manager) if self.units.manager else '',
                       self.units.name))
