"""docs/deployment-folder.md describes the rules refresh that exists (issue 17, item 11)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _doc():
    with open(os.path.join(ROOT, 'docs', 'deployment-folder.md')) as handle:
        return handle.read()


def test_no_claim_that_there_is_no_refresh_step():
    text = ' '.join(_doc().split())
    assert 'no refresh step' not in text
    assert 'A newer collection version does not replace them.' not in text or 'egress_upgrade_refresh_rules' in text


def test_the_refresh_is_described_and_linked():
    text = _doc()
    assert '(upgrade.md)' in text
    for words in ('egress_upgrade_refresh_rules=true', 'pi_dispatch.egress.egress_rules', 'upgrade.yml',
                  'egress-proxy.conf.bak-YYYYMMDDTHHMMSSZ', '--check --diff', 'restore_from'):
        assert words in text, words
    # the create-only promise still stands for every other file
    assert 'created when missing and otherwise left exactly as it is' in text
