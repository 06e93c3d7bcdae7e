# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""Job networks: the credential placeholders a job gets (docs/credentials.md).

With ``credentials_dir`` (the deployment folder) given to ``create_job_network``, and a credential declared
there, the job gets, instead of each secret, a placeholder unique to it. The placeholders are recorded
against the job id and its network's subnet in ``credentials/jobs/<job>.json``, the folder the interceptor
reads. The job also gets the deployment CA to trust: ``ca_mounts`` (host file → path in the job) and the
variables common clients read. ``NODE_EXTRA_CA_CERTS`` names the CA alone (Node adds it to its own). The
variables that replace a client's whole trust store (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``,
``GIT_SSL_CAINFO``) name a bundle: the host's public CAs plus the deployment CA.

Before anything is created, each declared secret file is checked: an unusable one refuses the job,
naming the credential (pre-spend). Teardown removes the record.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Dict, List, Optional, Tuple

from ansible_collections.pi_dispatch.egress.plugins.module_utils._common import files as _files
from ansible_collections.pi_dispatch.egress.plugins.module_utils._jobnets.names import JobNetError
from ansible_collections.pi_dispatch.egress.plugins.module_utils._policy import credentials as _credentials

FOLDER = 'credentials'
# Where the job finds the deployment CA (alone) and the bundle (public CAs + deployment CA).
CA_IN_JOB = '/etc/pi-dispatch/egress-ca.pem'
BUNDLE_IN_JOB = '/etc/pi-dispatch/egress-ca-bundle.pem'
CA_FILE = os.path.join('ca', 'mitmproxy-ca-cert.pem')
BUNDLE_FILE = 'job-ca-bundle.pem'
HOST_BUNDLE = '/etc/ssl/certs/ca-certificates.crt'


def jobs_dir(credentials_dir: str) -> str:
    return os.path.join(credentials_dir, FOLDER, 'jobs')


def record_path(credentials_dir: str, job_id: str) -> str:
    return os.path.join(jobs_dir(credentials_dir), '%s.json' % job_id)


def declared(credentials_dir: str) -> List[_credentials.Credential]:
    """The declared credentials, each secret file checked; JobNetError names a refused file or an unusable
    secret (nothing was created)."""
    try:
        creds, _path, _exists = _credentials.load(credentials_dir)
    except _credentials.CredentialsError as exc:
        raise JobNetError(str(exc))
    problems = [p for p in (_credentials.check_secret(c) for c in creds) if p]
    if problems:
        raise JobNetError('The job is refused before it starts: %s. Nothing was created.' % '; '.join(problems))
    if creds and not os.path.isfile(os.path.join(credentials_dir, FOLDER, CA_FILE)):
        raise JobNetError('%s declares credentials but the interceptor has made no CA yet (%s). Run '
                          'playbooks/site.yml (the proxy role runs the interceptor). Nothing was created.'
                          % (os.path.join(credentials_dir, _credentials.FILE_NAME),
                             os.path.join(credentials_dir, FOLDER, CA_FILE)))
    return creds


def bundle(credentials_dir: str, host_bundle: str = HOST_BUNDLE) -> str:
    """The job's CA bundle (the host's public CAs, then the deployment CA), written when it differs."""
    path = os.path.join(credentials_dir, FOLDER, BUNDLE_FILE)
    with open(os.path.join(credentials_dir, FOLDER, CA_FILE)) as handle:
        ca = handle.read()
    try:
        with open(host_bundle) as handle:
            public = handle.read()
    except OSError:
        public = ''
    text = public.rstrip('\n') + '\n' + ca if public else ca
    try:
        with open(path) as handle:
            if handle.read() == text:
                return path
    except OSError:
        pass
    _files.write_atomic(path, text)
    os.chmod(path, 0o644)
    return path


def issue(credentials_dir: str, creds: List[_credentials.Credential], job_id: str, subnet: str
          ) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Record the job's placeholders and return (env, ca_mounts {host file: path in the job})."""
    issued = _credentials.job_placeholders(creds, job_id)
    path = record_path(credentials_dir, job_id)
    # The same job asking again (an idempotent create) keeps the placeholders it was given.
    try:
        with open(path) as handle:
            before = json.load(handle).get('placeholders') or {}
    except (OSError, ValueError, AttributeError):
        before = {}
    if not isinstance(before, dict):
        before = {}
    for name, item in issued.items():
        if _credentials.is_placeholder_shaped(before.get(name)):
            item['placeholder'] = before[name]
    record = dict(job=job_id, subnets=[subnet], placeholders=dict((name, item['placeholder'])
                                                                  for name, item in issued.items()))
    folder = jobs_dir(credentials_dir)
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    os.chmod(folder, 0o700)
    # Atomic (the interceptor reads the folder at any moment) and root-only from its first byte (mkstemp
    # makes 0600): the file names the job's placeholders.
    fd, tmp = tempfile.mkstemp(prefix='.%s.' % job_id, suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'w') as handle:
            handle.write(json.dumps(record, sort_keys=True) + '\n')
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    env = dict((item['env'], item['placeholder']) for item in issued.values())
    env['NODE_EXTRA_CA_CERTS'] = CA_IN_JOB
    for var in ('SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'GIT_SSL_CAINFO'):
        env[var] = BUNDLE_IN_JOB
    mounts = {os.path.join(credentials_dir, FOLDER, CA_FILE): CA_IN_JOB, bundle(credentials_dir): BUNDLE_IN_JOB}
    return env, mounts


def forget(credentials_dir: Optional[str], job_id: str, check_mode: bool = False) -> List[str]:
    """Remove the job's record (teardown); the actions taken."""
    if not credentials_dir:
        return []
    path = record_path(credentials_dir, job_id)
    if not os.path.exists(path):
        return []
    if not check_mode:
        os.unlink(path)
    return ['forget the placeholders of %s' % job_id]
