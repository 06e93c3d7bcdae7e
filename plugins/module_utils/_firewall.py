# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The host-firewall layer: this collection's own iptables chains, computed from the daemon.

``--internal`` stops a job network routing anywhere, but its gateway is this
host, so a service listening on ``0.0.0.0`` answers a job that dials it. This
layer drops that traffic on the host, in chains the collection owns:

* ``<prefix>-INPUT``, jumped from ``INPUT`` (rule 1): nothing from a job or
  canary network reaches the host itself (replies to connections the host
  opened still do); IPv4 also by source, the whole job-network pool, so a job
  network created after the last run is covered too;
* ``<prefix>-FORWARD``, jumped from ``DOCKER-USER`` (rule 1): nothing is
  forwarded off a job or canary network, or onto one from elsewhere (defence in
  depth for a job network that is not ``--internal`` by mistake); traffic
  between two containers on the SAME bridge (a job and the proxy) passes;
* optionally ``<prefix>-UPSTREAM``: the proxy's own traffic out of the upstream
  network, to the host or forwarded, only to TCP 80, 443, the declared model
  endpoint ports and DNS.

The layer never ACCEPTs: its rules DROP or RETURN, so it can only take away
from what Docker's own rules allow. It never flushes or deletes a chain it
does not own and it touches exactly one rule in ``INPUT`` and one in
``DOCKER-USER`` (its jumps), so ``state: absent`` leaves ``iptables-save``
as it was before, minus counters.

This file only re-exports (the module ``egress_firewall``, the doctor and the
tests import it as one namespace); the code is in files of one concern each:

* ``_firewall_params.py``: names and parameters, validated, and the comment
  rule that records them (:func:`validate_prefix`, :func:`chain_names`,
  :func:`params_comment` / :func:`parse_params`, :func:`endpoint_ports`);
* ``_firewall_rules.py``: the wanted ruleset from the daemon's network list
  (:func:`bridge_of`, :func:`classify`, :func:`select_networks`,
  :func:`wanted`, :func:`compute`, :func:`render_install`);
* ``_firewall_table.py``: the table that is there and the way to the wanted
  one (:func:`parse_save`, :func:`strip_counters`, :func:`plan`,
  :func:`currency`, :func:`present_params`);
* ``_firewall_host.py``: this host's iptables, the only I/O (:class:`Runner`,
  :func:`detect`, :func:`read_table`, :func:`apply`, :func:`converge`).

Everything but ``_firewall_host.py`` is pure and unit-tested with tables;
the I/O (``iptables -V``, ``iptables-save``, ``iptables-restore --noflush``)
goes through a :class:`Runner` so tests can point it at a throwaway network
namespace.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall_host import (
    Backend,
    Runner,
    apply,
    converge,
    detect,
    parse_version,
    read_table,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall_params import (
    CHAIN_MAX,
    COMMENT_MAX,
    DEFAULT_PORTS,
    DEFAULT_PREFIX,
    DEFAULT_UPSTREAM,
    DNS_PORT,
    FAMILIES,
    FORWARD_HOOK,
    IFACE_MAX,
    INPUT_HOOK,
    KINDS,
    MULTIPORT_MAX,
    PARAMS_TAG,
    FirewallError,
    chain_names,
    endpoint_ports,
    params_comment,
    parse_params,
    validate_network_names,
    validate_pool,
    validate_ports,
    validate_prefix,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall_rules import (
    BRIDGE_NAME_OPTION,
    DOCTOR_LABEL,
    DOCTOR_NETWORK_RE,
    Net,
    Ruleset,
    bridge_of,
    classify,
    compute,
    empty,
    forward_hook_for,
    render_install,
    ruleset_lines,
    select_networks,
    wanted,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._firewall_table import (
    HOOKS,
    Plan,
    Table,
    currency,
    ours,
    parse_save,
    plan,
    present_params,
    strip_counters,
)

__all__ = [
    # names and parameters
    'CHAIN_MAX', 'COMMENT_MAX', 'DEFAULT_PORTS', 'DEFAULT_PREFIX', 'DEFAULT_UPSTREAM', 'DNS_PORT', 'FAMILIES',
    'FORWARD_HOOK', 'IFACE_MAX', 'INPUT_HOOK', 'KINDS', 'MULTIPORT_MAX', 'PARAMS_TAG', 'FirewallError',
    'chain_names', 'endpoint_ports', 'params_comment', 'parse_params', 'validate_network_names', 'validate_pool',
    'validate_ports', 'validate_prefix',
    # the wanted ruleset
    'BRIDGE_NAME_OPTION', 'DOCTOR_LABEL', 'DOCTOR_NETWORK_RE', 'Net', 'Ruleset', 'bridge_of', 'classify',
    'compute', 'empty', 'forward_hook_for', 'render_install', 'ruleset_lines', 'select_networks', 'wanted',
    # the present table, the plan, the doctor's reading
    'HOOKS', 'Plan', 'Table', 'currency', 'ours', 'parse_save', 'plan', 'present_params', 'strip_counters',
    # this host's iptables
    'Backend', 'Runner', 'apply', 'converge', 'detect', 'parse_version', 'read_table',
]
