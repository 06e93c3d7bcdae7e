# -*- coding: utf-8 -*-
# Copyright: pi-dispatch egress contributors
# Apache License 2.0 (see LICENSE)
"""The doctor's TLS name check verdicts: the two canary probes that open a tunnel to the provider and misuse it.

* ``sni``: a tunnel to the provider's 443 whose TLS hello names the unlisted
  host; cut, or domain fronting works;
* ``tunnel_plain``: plain HTTP bytes in a tunnel to the provider's 443; cut,
  or any protocol passes there.

Both are one verdict (:func:`classify_tls_check`): the tunnel must open (else
the probe did not run), and then nothing may answer. Pure.
"""

from __future__ import annotations

from typing import Optional

from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.lines import Line
from ansible_collections.pi_dispatch.egress.plugins.module_utils._doctor.probes import no_answer, notrun_line

TLS_CHECK_FIX = ('refresh the proxy to rules version 3 and its image (ansible-playbook pi_dispatch.egress.upgrade '
                 '-e egress_upgrade_refresh_rules=true; docs/rules.md, "The TLS name check")')

# probe -> (ok id, ok message, leak id, leak message); %(provider)s, %(deny)s and %(code)d are filled in.
TLS_CHECKS = {
    'sni': ('canary.sni',
            'Egress policy cuts a tunnel whose TLS name is not its CONNECT host (CONNECT %(provider)s:443 carrying a '
            'hello for %(deny)s: the TLS name check cut it, nothing was answered)',
            'canary.sni_leaks',
            'Egress policy lets a listed host\'s tunnel carry TLS for another name (CONNECT %(provider)s:443 with the '
            'hello for %(deny)s got HTTP %(code)d: domain fronting passes)'),
    'tunnel_plain': ('canary.tunnel_plain',
                     'Egress policy cuts plain bytes in a tunnel to 443 (a plain GET inside CONNECT %(provider)s:443: '
                     'the TLS name check cut it, nothing was answered)',
                     'canary.tunnel_plain_leaks',
                     'Egress policy lets plain bytes through a tunnel to 443 (a plain GET inside CONNECT '
                     '%(provider)s:443 got HTTP %(code)d: any protocol passes on 443)'),
}


def classify_tls_check(probe: str, provider: str, deny: str, result: Optional[dict],
                       why_not: Optional[str] = None) -> Line:
    """The line of the TLS name check ``probe`` (``sni`` or ``tunnel_plain``) from its parsed ``result``."""
    if result is None:
        return notrun_line(probe, why_not or 'the probe printed no result')
    connect = result['connect']
    if connect == 403:
        return notrun_line(probe, 'the proxy refused the tunnel to the provider (403), so there was no tunnel to '
                                  'check; list the provider (see canary.provider)')
    if connect != 200:
        return notrun_line(probe, 'the tunnel to the provider did not open: %s' % (
            'the proxy answered %d' % connect if connect else no_answer(result)))
    ok_id, ok_message, leak_id, leak_message = TLS_CHECKS[probe]
    words = dict(provider=provider, deny=deny, code=result['code'])
    if not result['code']:
        return Line(ok_id, 'ok', ok_message % words)
    return Line(leak_id, 'fail', leak_message % words, fix=TLS_CHECK_FIX)
