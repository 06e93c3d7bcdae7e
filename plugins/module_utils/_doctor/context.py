# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's shared context: one run's settings and the facts its checks hand on, and the check interface.

Every group of checks (``_doctor/proxy.py``, ``canary.py``, ``squid.py``, ...)
is a :class:`Check`: one method, ``lines(ctx)``, over one
:class:`DoctorContext`. A check reads the settings and the facts an earlier
check left (the proxy's inspect, its family, the declared endpoints, the
image the probes run) and writes only the facts it is the source of; it never
calls into another check. :class:`_doctor.doctor.Doctor` builds the context
and runs the checks in report order.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Dict, List, Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import endpoints as _endpoints
from ansible_collections.pi_dispatch.egress.plugins.module_utils._proxy import decisions as _decisions
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line


@dataclasses.dataclass
class DoctorContext:
    """One doctor run: the daemon client, the settings (from ``DoctorOptions``) and the shared facts.

    Settings are read by every check and written by none, except ``probe_image``: the probe-image
    check switches it to the fallback image when the probe image is missing.
    """

    # --- settings ------------------------------------------------------------------------------
    client: Any
    proxy: str
    deploy_dir: Optional[str]
    probe_image: str
    pid: int
    environ: Any
    fallback_probe_image: Optional[str] = None
    provider_host: str = ''
    deny_host: str = ''
    listed_host: str = ''
    probe_timeout: int = 10
    start_grace: int = 20
    docker_host: Optional[str] = None
    check_mode: bool = False
    endpoint_timeout: int = 15
    models_json: Optional[str] = None
    isolation_enabled: bool = True
    job_pool: Any = None
    job_prefix: int = 0
    squid_candidate: bool = True
    sweep_enabled: bool = True
    firewall: Optional[dict] = None
    decision_log_dir: str = ''
    gateway: Optional[str] = None           # the transparent gateway (none: no transparent check)
    transparent_port: Optional[str] = None  # host:port the transparent canary opts in and must reach
    credentials_interceptor: str = ''       # the credential interceptor (credentials.py; '' its default name)
    credentials_probe_paths: Dict[str, str] = dataclasses.field(default_factory=dict)  # credential -> path
    openshell_policy: Optional[str] = None  # a deployed OpenShell policy file (openshell.py; none: no line)
    openshell_gateway: Optional[Dict[str, Any]] = None  # a gateway and its sandbox (openshell.py; none: no line)
    openshell_credential_provider: Optional[str] = None  # the job's provider, every endpoint bound to it
    openshell_github_repository: Optional[str] = None  # a GitHub job's own repository: github.com pushes there only
    openshell_project_policy: Optional[str] = None  # the job's project policy: its opt-ins in the render
    forge_urls: Dict[str, str] = dataclasses.field(default_factory=dict)  # name -> URL (forge.py; {}: env)
    mcp_json: Optional[str] = None          # the overlay's mcp.json (mcp.py; none: no line)

    # --- what the run did (the module reports them) ----------------------------------------------
    actions: List[str] = dataclasses.field(default_factory=list)
    timings: Dict[str, float] = dataclasses.field(default_factory=dict)

    # --- facts a check leaves for the checks after it ----------------------------------------------
    attrs: Optional[dict] = None          # the proxy's inspect (ProxyCheck); None: no such container
    family: list = dataclasses.field(default_factory=list)  # the proxy's family (ShardsCheck)
    isolation_lines: List[Line] = dataclasses.field(default_factory=list)  # CanaryCheck, which runs isolation
    endpoints_loaded: Optional[list] = None  # the declared endpoints, once read (see declared_endpoints)
    endpoints_error: Optional[str] = None
    launched: List[str] = dataclasses.field(default_factory=list)  # probe containers started (containers.py)
    mcp_judged: Optional[tuple] = None    # (findings, problem) of mcp_json, once read (mcp.py)
    lock: Any = dataclasses.field(default_factory=threading.Lock)

    @classmethod
    def build(cls, client: Any, options: Any) -> 'DoctorContext':
        """The context of one run of ``options`` (a ``DoctorOptions``) against ``client``."""
        return cls(
            client=client,
            proxy=options.proxy,
            deploy_dir=options.deploy_dir,
            probe_image=options.probe_image,
            fallback_probe_image=options.fallback_probe_image,
            provider_host=options.provider_host,
            deny_host=options.deny_host,
            listed_host=options.listed_host or options.provider_host,
            probe_timeout=int(options.probe_timeout),
            start_grace=int(options.start_grace),
            docker_host=options.docker_host,
            check_mode=options.check_mode,
            pid=os.getpid() if options.pid is None else int(options.pid),
            environ=os.environ if options.environ is None else options.environ,
            endpoint_timeout=int(options.endpoint_timeout),
            models_json=options.models_json or None,
            isolation_enabled=bool(options.isolation),
            job_pool=options.job_pool,
            job_prefix=int(options.job_prefix),
            squid_candidate=bool(options.squid_candidate),
            sweep_enabled=bool(options.sweep),
            firewall=options.firewall,
            gateway=getattr(options, 'gateway', None) or None,
            transparent_port=getattr(options, 'transparent_port', None) or None,
            credentials_interceptor=getattr(options, 'credentials_interceptor', None) or '',
            credentials_probe_paths=dict(getattr(options, 'credentials_probe_paths', None) or {}),
            openshell_policy=getattr(options, 'openshell_policy', None) or None,
            openshell_gateway=getattr(options, 'openshell_gateway', None) or None,
            openshell_credential_provider=getattr(options, 'openshell_credential_provider', None) or None,
            openshell_github_repository=getattr(options, 'openshell_github_repository', None) or None,
            openshell_project_policy=getattr(options, 'openshell_project_policy', None) or None,
            forge_urls=dict(getattr(options, 'forge_urls', None) or {}),
            mcp_json=getattr(options, 'mcp_json', None) or None,
            decision_log_dir=options.decision_log_dir or os.path.join(options.deploy_dir or '',
                                                                      _decisions.DEFAULT_FOLDER),
        )

    @property
    def proxy_running(self) -> bool:
        """Whether the proxy's inspect says it runs (and is not paused)."""
        state = (self.attrs or {}).get('State') or {}
        return bool(self.attrs is not None and state.get('Running') and not state.get('Paused'))

    def declared_endpoints(self) -> Optional[list]:
        """The declared endpoints, read once; None with ``endpoints_error`` set when the declaration is refused."""
        if self.endpoints_loaded is not None or self.endpoints_error is not None:
            return self.endpoints_loaded
        try:
            self.endpoints_loaded = list(_endpoints.load(self.deploy_dir)[0])
        except Exception as exc:  # EndpointsError names the file, the key and the fix
            self.endpoints_error = ' '.join(str(exc).split())
        return self.endpoints_loaded


class Check(object):
    """One group of the doctor's checks: ``lines(ctx)`` returns its lines, in report order."""

    def lines(self, ctx: DoctorContext) -> List[Line]:
        raise NotImplementedError
