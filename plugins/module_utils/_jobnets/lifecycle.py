# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: create one for a job (``--internal``, labelled, the proxy attached).

:func:`create_job_network` is the call a job runner makes before each job
(``teardown.py`` the one after it); it is idempotent and either finishes or
changes nothing (a create whose proxy or gateway attach fails removes its
network again). Re-exported by ``jobnet.py``, the published job-network API
(docs/job-network-api.md).
"""

from __future__ import annotations

import ipaddress
import random
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import lock as _jobnet_lock
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shards as _shards
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import shard_clone as _shard_clone
from ansible_collections.pi_dispatch.egress.plugins.module_utils._common.docker_client import (
    EngineError,
    api_message,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.engine import (
    as_engine_error,
    client_memo,
    connect_proxy,
    connection_failed,
    disconnect,
    inspect_job_network,
    remove_network,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import (
    LABEL_MODE,
    JobNetError,
    ownership_problem,
    NO_PROXY,
    PROXY_PORT,
    container_name,
    job_env,
    job_labels,
    network_name,
    validate_job_id,
)
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.spec import PROXY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import credentials as _jobcreds
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets import transparent as _transparent
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import deployment as _deployment
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy.gateway import GATEWAY_NAME
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.pool import (
    DEFAULT_POOL,
    DEFAULT_PREFIX,
    PoolExhausted,
    allocate_subnet,
    forget_subnet,
    parse_pool,
    route_subnets,
    subnet_book,
    subnet_of,
)

# How many subnets create tries when the daemon refuses the one it picked as
# overlapping (a creator this host's lock does not cover won the race, or a network the client's book
# did not have holds it); each try after a refusal lists the networks again and starts its pick at
# a random place in the pool, so creators on other hosts spread out instead of racing again.
CREATE_ATTEMPTS = 5

_ALLOC_LOCK = threading.Lock()


class JobNetwork(object):
    """What a job runner needs to start the job container on its network.

    Attributes: ``job_id``; ``network`` (``pi-job-<id>-net``); ``container``
    (``pi-job-<id>``, the name the job container must get); ``subnet`` (CIDR
    text); ``env`` (the proxy variables, :func:`job_env`); ``network_id``
    (None in check mode); ``changed``; ``actions`` (what was done, or in
    check mode what would be); ``proxy`` (the container that carries it: the
    proxy or one of its shards, which the job reaches by the proxy's name);
    ``mode`` (``explicit`` or ``transparent``); for a transparent network
    ``dns`` (the gateway's address the job resolves through), ``gateway``
    (its container) and ``optins`` (what the project opened, as a dict);
    ``ca_mounts`` ({host file: path in the job}: the deployment CA and its bundle, when the job got
    credential placeholders, docs/credentials.md).
    """

    def __init__(self, job_id: str, network: str, container: str, subnet: Optional[str], env: Dict[str, str],
                 network_id: Optional[str] = None, changed: bool = False, actions: Optional[List[str]] = None,
                 proxy: Optional[str] = None, mode: str = _transparent.EXPLICIT, dns: Optional[str] = None,
                 gateway: Optional[str] = None, optins: Optional[Dict[str, Any]] = None,
                 ca_mounts: Optional[Dict[str, str]] = None) -> None:
        self.job_id = job_id
        self.ca_mounts = dict(ca_mounts or {})
        self.mode = mode
        self.dns = dns
        self.gateway = gateway
        self.optins = optins
        self.proxy = proxy
        self.network = network
        self.container = container
        self.subnet = subnet
        self.env = env
        self.network_id = network_id
        self.changed = changed
        self.actions = list(actions or [])

    def run_args(self) -> List[str]:
        """``docker run`` arguments for the job container (name, network, env).

        A transparent job gets no proxy variable; it resolves through its gateway (``--dns``) and
        holds no raw socket (``--cap-drop NET_RAW``): it needs nothing else, and no capability.
        """
        args = ['--name', self.container, '--network', self.network]
        if self.mode == _transparent.TRANSPARENT:
            args += ['--dns', str(self.dns), '--cap-drop', 'NET_RAW']
        for source in sorted(self.ca_mounts):
            args += ['-v', '%s:%s:ro' % (source, self.ca_mounts[source])]
        for key in sorted(self.env):
            args += ['-e', '%s=%s' % (key, self.env[key])]
        return args

    def as_dict(self) -> Dict[str, Any]:
        return dict(job_id=self.job_id, network=self.network, container=self.container,
                    subnet=self.subnet, env=dict(self.env), network_id=self.network_id,
                    changed=self.changed, actions=list(self.actions), proxy=self.proxy, mode=self.mode,
                    dns=self.dns, gateway=self.gateway, optins=self.optins, ca_mounts=dict(self.ca_mounts))

    def __repr__(self) -> str:
        return 'JobNetwork(%r)' % (self.as_dict(),)


# --------------------------------------------------------------------------
# Create and teardown
# --------------------------------------------------------------------------

def _overlap_refused(message: str) -> bool:
    """The daemon refused the subnet as taken: Docker's "Pool overlaps with other one on this address
    space" or "networks have overlapping IPv4", Podman's "subnet ... is already used on the host or by
    another config"."""
    text = message.lower()
    return 'overlap' in text or 'is already used' in text


def _existing_job_network(client: Any, name: str, job_id: str, proxy_name: str, env: Dict[str, str], cname: str,
                          check_mode: bool, shard_bound: Optional[int] = 0, how: Optional['_transparent.How'] = None
                          ) -> Optional[JobNetwork]:
    attrs = inspect_job_network(client, name)
    if attrs is None:
        return None
    how = how or _transparent.How()
    have_mode = (attrs.get('Labels') or {}).get(LABEL_MODE, _transparent.EXPLICIT)
    if have_mode != how.mode:
        raise EngineError("Network %s exists as a %s job network, and this call asks for %s. Nothing was "
                          "changed. Tear it down first, or ask for the mode it has." % (name, have_mode, how.mode))
    problem = ownership_problem(attrs, job_id)
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
    carriers = _shards.family_on(attrs, proxy_name)
    carrier = carriers[0] if carriers else None
    if carrier is None:
        if check_mode:
            carrier = _carrier_for(client, proxy_name, shard_bound, check_mode=True)
            actions.append('attach %s' % carrier)
        else:
            try:
                carrier = _attach(client, attrs['Id'], name, proxy_name, shard_bound)
                actions.append('attach %s' % carrier)
            except EngineError as exc:
                raise EngineError(
                    "Attaching the proxy %s to the existing network %s failed: %s. The network "
                    "was left as it was. Start or create the proxy (playbooks/site.yml), then "
                    "retry." % (proxy_name, name, exc))
    if how.mode == _transparent.TRANSPARENT and not check_mode:
        actions += _transparent.with_gateway(client, attrs['Id'], name, job_id, carrier, how)
        attrs = inspect_job_network(client, name) or attrs
    return how.result(JobNetwork(job_id, name, cname, subnet_of(attrs), env, attrs.get('Id'),
                                 changed=bool(actions), actions=actions, proxy=carrier), attrs)


def _carrier_for(client: Any, proxy_name: str, shard_bound: Optional[int], check_mode: bool = False) -> str:
    """The name of the family member a new job network gets (in check mode: what it would be).

    :func:`_shards.pick` from what the client remembers (as a rule two container inspects); only
    when every member it knows is full is the whole family read, and a shard added when it really is.
    """
    if shard_bound == 0:
        return proxy_name
    memo = client_memo(client)
    chosen = _shards.pick(client, proxy_name, shard_bound, memo)
    if chosen is not None:
        return chosen.name
    if check_mode:
        family = _shards.members(client, proxy_name)
        chosen = _shards.choose(family, shard_bound)
        return chosen.name if chosen else _shards.shard_name(proxy_name, _shards.next_index(family)) + ' (a new shard)'
    with _ALLOC_LOCK:
        family = _shards.members(client, proxy_name)
        _shards.remember(memo, proxy_name, family)
        chosen = _shards.choose(family, shard_bound)
        if chosen is None:
            chosen = _shard_clone.add_shard(client, proxy_name, family)
            _shards.note(memo, proxy_name, chosen.name, member=chosen)
    return chosen.name


def _attach(client: Any, net_id: str, net_name: str, proxy_name: str, shard_bound: Optional[int]) -> str:
    """Attach the chosen family member (a shard with the proxy's name as its alias). Returns its name.

    A shard removed between the choice and the attach (its last job went meanwhile) is chosen
    again, once, from a fresh read of the whole family.
    """
    memo = client_memo(client)
    for attempt in (1, 2):
        carrier = _carrier_for(client, proxy_name, shard_bound)
        try:
            connect_proxy(client, net_id, carrier, aliases=[proxy_name] if carrier != proxy_name else None)
        except EngineError as exc:
            if attempt == 2 or carrier == proxy_name or 'no such container' not in str(exc).lower():
                raise
            _shards.forget(memo, proxy_name)
            continue
        _shards.note(memo, proxy_name, carrier, net_name)
        return carrier
    return carrier  # pragma: no cover - the loop returns or raises


def _make_network(client: Any, memo: Dict[Any, Any], name: str, labels: Dict[str, str], pool: str, prefix: int,
                  routes: Optional[Sequence[Any]], split: bool = False
                  ) -> Tuple[Optional[str], Optional[ipaddress.IPv4Network]]:
    """Create ``name`` on a free subnet of the pool: (network id, subnet), or (None, None) when it exists.

    Called under the daemon's lock (_jobnet_lock), so no creator on this host picks at the same
    time. The subnet comes from the client's book (``_jobnet_pool.subnet_book``: no Engine call when
    it has one) and the host's routes. A subnet the daemon refuses as overlapping is taken by a
    network the book did not have (made by a creator on another host, or outside this collection):
    it is marked taken and the next try lists the networks again and picks from a random place in
    the pool, CREATE_ATTEMPTS tries in all. Holds _ALLOC_LOCK (threads of one process take subnets
    in turn).
    """
    from docker.types import IPAMConfig, IPAMPool

    blocked = route_subnets(routes)
    refused = []
    last = None
    capacity = 2 ** (prefix - parse_pool(pool, prefix)[0].prefixlen)
    with _ALLOC_LOCK:
        for attempt in range(CREATE_ATTEMPTS):
            book = subnet_book(client, memo, refresh=attempt > 0)
            for taken in refused:
                book.add(taken)
            start = random.randrange(capacity) if attempt > 0 else None
            try:
                subnet = allocate_subnet(pool, prefix, book.taken() + blocked, start=start)
            except PoolExhausted:
                # The book may be behind (networks removed by another process), or the job's network
                # is there already (an idempotent call on a full pool).
                book = subnet_book(client, memo, refresh=True)
                for taken in refused:
                    book.add(taken)
                try:
                    subnet = allocate_subnet(pool, prefix, book.taken() + blocked, start=start)
                except PoolExhausted:
                    if inspect_job_network(client, name) is not None:
                        return None, None
                    raise
            try:
                resp = client.api.create_network(
                    name, driver='bridge', internal=True, labels=labels, check_duplicate=True,
                    ipam=IPAMConfig(pool_configs=[IPAMPool(
                        subnet=str(subnet), iprange=str(_transparent.halves(subnet)[0]) if split else None)]))
            except Exception as exc:
                if connection_failed(exc):
                    raise as_engine_error('Creating network %s failed' % name, exc)
                last = api_message(exc)
                if 'already exists' in last.lower():
                    return None, None
                if _overlap_refused(last):
                    refused.append(subnet)
                    continue
                raise EngineError("Creating network %s (%s) failed: %s. Nothing was created."
                                  % (name, subnet, last))
            book.add(subnet)
            return resp['Id'], subnet
    raise EngineError(
        "Creating network %s failed: the daemon refused %d subnets of %s in a row as overlapping (%s; "
        "it said: %s), although none was taken in its network listing or this host's routes when it "
        "was picked. Creators on another host sharing this daemon are taking them as fast, or networks "
        "the listing does not show hold them. Nothing was created. Retry (the error is retryable), or "
        "give job networks a pool nothing else allocates from."
        % (name, len(refused), pool, ', '.join(str(s) for s in refused), last), retryable=True)


def create_job_network(client: Any, job_id: str, proxy_name: str = PROXY_NAME, proxy_port: int = PROXY_PORT,
                       pool: str = DEFAULT_POOL, prefix: int = DEFAULT_PREFIX,
                       routes: Optional[Sequence[Any]] = None, no_proxy: str = NO_PROXY, check_mode: bool = False,
                       now: Optional[float] = None, owner_host: Optional[str] = None,
                       shard_bound: Optional[int] = None, mode: str = _transparent.EXPLICIT,
                       project_policy: Optional[str] = None, gateway_name: str = GATEWAY_NAME,
                       credentials_dir: Optional[str] = None, deploy_dir: Optional[str] = None) -> JobNetwork:
    """Create ``pi-job-<id>-net`` (--internal, labelled, a subnet from the pool), attach the proxy.

    Idempotent: an existing network of ours that is internal is kept, and the
    proxy is attached when it is not. An existing network with another job's
    label, foreign labels, or without --internal is refused (nothing changed).
    If attaching the proxy fails, the network this call created is removed
    again and EngineError carries the daemon's reason.

    ``routes``: None reads this host's routes (right for a local daemon);
    pass ``[]`` (or the daemon host's routes) for a remote daemon.
    Engine calls on the ordinary path: create, the inspect of the proxy (and
    of the shard that gets the network), connect; none of them grows with
    the number of networks on the daemon. The network listing the subnet is
    picked from is made once per client and kept up to date by its creates
    and teardowns (``_jobnet_pool.subnet_book``); it is made again after a
    minute, or when the daemon refuses a pick (the name exists: inspect).
    ``check_mode`` changes nothing and reports what would be done; ``now``
    (epoch seconds) and ``owner_host`` override the ``created`` and
    ``owner-host`` labels. ``shard_bound`` is how many job networks the proxy
    and each of its shards carry (0: no shards; None, the default: the bound the
    proxy carries as its label, set by the role variable egress_proxy_shard_bound,
    else DEFAULT_SHARD_BOUND, 10): the network gets the least-loaded running
    member below it, a new shard when all are full (_shards.py), and the job
    still reaches the proxy by its name (the shard's network alias).
    Safe to call from any number of threads and processes on this host at
    once: the pick of the subnet and of the member, and the calls that make
    them true, run under the daemon's host-wide lock (_jobnet_lock: a flock,
    dropped by the kernel when a holder dies), so every creator succeeds while
    the pool has room and no member passes its bound. Creators on other hosts
    sharing the daemon are not under that lock: the daemon refuses an
    overlapping subnet and create picks again from a random place in the
    pool, up to CREATE_ATTEMPTS times.

    ``mode='transparent'`` (docs/transparent.md) makes a network whose job
    needs no proxy variable: the network is a /26 (``prefix`` left at its
    default; /27 or wider when given), labelled with its mode, and the
    gateway ``gateway_name`` is attached beside the proxy and told the
    network's opt-ins, read from ``project_policy`` (the project's
    ``.pi-container/config.yaml``; written deny-all, create-only, when it is
    missing; None: deny-all, no file). The result's ``env`` is empty and
    ``run_args()`` carries ``--dns <gateway>``. A refused policy file raises
    JobNetError naming the file and key, before anything is created. A
    policy that opens any port takes effect only as the operator approved
    it (``approve_optins``) into ``deploy_dir``, the deployment folder
    (default: ``credentials_dir`` when given, else /opt/pi-dispatch/egress);
    any other raises JobNetError with the diff and the approving command,
    before the daemon is asked.

    ``credentials_dir`` (the deployment folder; docs/credentials.md): when its
    ``egress-credentials.json`` declares credentials, each secret file is
    checked first (an unusable one raises JobNetError naming the credential,
    nothing created); the job's ``env`` then carries a placeholder, unique to
    it, in each credential's variable, and the CA variables; ``ca_mounts`` the
    CA files to mount. The placeholders are recorded against the job and its
    subnet for the interceptor; teardown forgets them.

    Returns a JobNetwork. Raises JobNetError (bad job id, pool or prefix;
    nothing touched), PoolExhausted (no free subnet), EngineError (the
    daemon refused, the name belongs to something else, or the proxy could
    not be attached; ``retryable`` True when another creator's race or the
    lock's wait is the cause) or its subclass EngineUnavailable (the daemon
    did not answer; retryable).
    """
    validate_job_id(job_id)
    _transparent.check_mode_name(mode)
    prefix = _transparent.prefix_for(mode, prefix, DEFAULT_PREFIX)
    parse_pool(pool, prefix)
    _shards.check_bound(shard_bound)
    how = _transparent.How(mode, None, gateway_name, proxy_port)
    if mode == _transparent.TRANSPARENT:
        if project_policy is not None:
            how.optins = _transparent.project_optins(
                project_policy, deploy_dir or credentials_dir or _deployment.DEFAULT_DEPLOY_DIR)
        env = {}  # type: Dict[str, str]
    else:
        if project_policy is not None:
            raise JobNetError('project_policy is read for a transparent job network only (it opens ports the '
                              'gateway forwards). Fix: pass mode=%r, or leave project_policy out. Nothing was '
                              'created.' % _transparent.TRANSPARENT)
        env = job_env(proxy_name, proxy_port, no_proxy)
    name = network_name(job_id)
    cname = container_name(job_id)
    labels = job_labels(job_id, now=now, host=owner_host)
    if mode == _transparent.TRANSPARENT:
        labels[LABEL_MODE] = mode
    memo = client_memo(client)
    creds = _jobcreds.declared(credentials_dir) if credentials_dir else []

    if check_mode:
        found = _existing_job_network(client, name, job_id, proxy_name, env, cname, True, shard_bound, how)
        if found is not None:
            return found
        subnet = allocate_subnet(pool, prefix, subnet_book(client, memo).taken() + route_subnets(routes))
        carrier = _carrier_for(client, proxy_name, shard_bound, check_mode=True)
        actions = ['create %s (%s)' % (name, subnet), 'attach %s' % carrier]
        if mode == _transparent.TRANSPARENT:
            actions.append('attach %s' % gateway_name)
        return how.result(JobNetwork(job_id, name, cname, str(subnet), env, None, changed=True,
                                     actions=actions, proxy=carrier))

    with _jobnet_lock.held(client, memo) as lock:
        made = _create_held(client, memo, lock, job_id, name, cname, env, labels, proxy_name, pool, prefix,
                            routes, shard_bound, how)
    if creds:
        try:
            more, made.ca_mounts = _jobcreds.issue(credentials_dir, creds, job_id, str(made.subnet))
        except OSError as exc:
            raise JobNetError('Recording the credential placeholders of %s failed: %s. The network %s exists; '
                              'tear it down (teardown_job_network) and retry.' % (job_id, exc, name))
        made.env.update(more)
        made.actions.append('issue the placeholders of %s' % ', '.join(c.name for c in creds))
    return made


def _create_held(client: Any, memo: Dict[Any, Any], lock: _jobnet_lock.Held, job_id: str, name: str, cname: str,
                 env: Dict[str, str], labels: Dict[str, str], proxy_name: str, pool: str, prefix: int,
                 routes: Optional[Sequence[Any]], shard_bound: Optional[int], how: _transparent.How) -> JobNetwork:
    """The create of :func:`create_job_network` under the daemon's lock (``lock``: _jobnet_lock.Held)."""
    for _round in (1, 2):
        net_id, subnet = _make_network(client, memo, name, labels, pool, prefix, routes,
                                       split=how.mode == _transparent.TRANSPARENT)
        if net_id is not None:
            break
        # The daemon has a network of that name: keep it when it is this job's.
        found = _existing_job_network(client, name, job_id, proxy_name, env, cname, False, shard_bound, how)
        if found is not None:
            if found.changed:
                lock.changed()
            return found
    else:
        raise EngineError("Creating network %s failed: the daemon says it exists, but it was gone when "
                          "inspected, twice. Nothing was created. Retry." % name, retryable=True)
    lock.changed()
    carrier = None
    gw_actions = []  # type: List[str]
    try:
        carrier = _attach(client, net_id, name, proxy_name, shard_bound)
        if how.mode == _transparent.TRANSPARENT:
            gw_actions = _transparent.with_gateway(client, net_id, name, job_id, carrier, how)
    except EngineError as exc:
        reason = str(exc)
        try:
            members = [how.gateway] if how.mode == _transparent.TRANSPARENT else []
            for member in members + ([carrier] if carrier else []):
                disconnect(client, member, net_id)
            remove_network(client, net_id)
            forget_subnet(memo, subnet)
            cleanup = 'the network was removed again, nothing is left'
        except EngineError as rm_exc:
            cleanup = ('removing the network again ALSO failed (%s): remove it with docker '
                       'network rm %s' % (rm_exc, name))
        what = 'the proxy %s' % proxy_name if carrier is None else 'the gateway %s' % how.gateway
        raise EngineError(
            "Attaching %s to %s failed: %s; %s. Start or create it "
            "(playbooks/site.yml), check it with the egress_preflight module, then retry."
            % (what, name, reason, cleanup), retryable=getattr(exc, 'retryable', False))
    attrs = inspect_job_network(client, name) if gw_actions else None
    return how.result(JobNetwork(job_id, name, cname, str(subnet), env, net_id, changed=True,
                                 actions=['create %s (%s)' % (name, subnet), 'attach %s' % carrier] + gw_actions,
                                 proxy=carrier), attrs)
