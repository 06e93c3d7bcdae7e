"""Every runnable example of docs/job-network-api.md, run against the real engine (issue 24).

The examples are the document's ``python`` blocks that are code rather than a signature (no ``->``)
and that do not name a remote daemon (``engine.example`` is never contacted). They run as written
with three substitutions, each needed because this is the test world and not a host with pi-dispatch:
the job image becomes the test tools image, the job's command a curl through the proxy, and
``_jobnet`` is the real module with the test proxy's name given to the calls that take one (the
examples use the default name, ``pi-dispatch-egress-proxy``, which a real deployment has).
"""

import contextlib
import io
import os
import re
import types

import pytest

docker = pytest.importorskip('docker')

from conftest import ROOT, TOOLS_IMAGE  # noqa: E402

from ansible_collections.pi_dispatch.egress.plugins.module_utils import jobnet as _jobnet  # noqa: E402

pytestmark = pytest.mark.integration

DOC = os.path.join(ROOT, 'docs', 'job-network-api.md')
CURL = "['sh', '-c', 'curl -sSk --max-time 10 -o /dev/null -w %{http_code} https://api.provider.test/v1/messages 2>&1']"


def examples():
    with open(DOC) as handle:
        text = handle.read()
    blocks = re.findall(r'```python\n(.*?)```', text, re.S)
    return [b for b in blocks if '->' not in b and 'engine.example' not in b]


def _bound_api(proxy):
    """``_jobnet`` with ``proxy_name`` defaulting to the test proxy for the calls that take it."""
    api = types.ModuleType('_jobnet_for_the_docs')
    api.__dict__.update(vars(_jobnet))
    for name in ('preflight', 'create_job_network', 'teardown_job_network', 'proxy_family'):
        real = getattr(_jobnet, name)

        def bound(*args, _real=real, **kwargs):
            kwargs.setdefault('proxy_name', proxy)
            return _real(*args, **kwargs)
        setattr(api, name, bound)
    return api


def test_the_document_has_the_examples_it_promises():
    blocks = examples()
    assert any('run_job' in b for b in blocks) and any('run_args()' in b for b in blocks)
    assert any('API_VERSION' in b for b in blocks)


def test_the_examples_run_as_written_in_order(egress_env):
    """The blocks run one after the other in one namespace, as a reader follows the page."""
    names = dict(_jobnet=_bound_api(egress_env.proxy), TOOLS_IMAGE=TOOLS_IMAGE, __name__='__doc_example__')
    out = io.StringIO()
    try:
        for index, code in enumerate(examples()):
            code = code.replace("'job-image:latest', ['node', 'agent.js']", 'TOOLS_IMAGE, ' + CURL)
            code = code.replace("['job-image:latest']", "[TOOLS_IMAGE, 'true']")
            assert 'job-image' not in code, 'example %d uses the job image in a way this test does not know' % index
            code = code.replace('from ansible_collections.pi_dispatch.egress.plugins.module_utils '
                                'import jobnet as _jobnet\n',
                                '')
            with contextlib.redirect_stdout(out):
                exec(compile(code, '%s, example %d' % (DOC, index), 'exec'), names)  # noqa: S102 - the doc's code
    finally:
        for job in ('job-1234', 'job-1235'):
            try:
                _jobnet.teardown_job_network(egress_env.client, job, proxy_name=egress_env.proxy)
            except _jobnet.EngineError:
                pass
    printed = out.getvalue()
    assert "'started': True" in printed and "401" in printed, printed      # run_job: the job reached the provider
    assert names['_jobnet'].API_VERSION == _jobnet.API_VERSION                  # the version the page states
    for job in ('job-1234', 'job-1235'):                                      # both examples tore down
        assert _jobnet.inspect_job_network(egress_env.client, _jobnet.network_name(job)) is None
