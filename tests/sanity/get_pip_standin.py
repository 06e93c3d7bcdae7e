"""A stand-in for ansible-test's pip bootstrap script, for machines that reach PyPI only.

``ansible-test sanity --venv`` fetches ``get-pip-<version>.py`` from
ci-files.testing.ansible.com, which our build and test machines cannot reach.
``./run``'s sanity gate runs ansible-test with ``HOME=.cache/ansible-test-home`` and
copies this file to ``~/.ansible/test/cache/get_pip_<version>.py`` there (where
ansible-test looks first) when no cached script is there. It does what
the real one does for ansible-test: put pip into the interpreter that runs it
(Python's own ensurepip), then install the packages ansible-test asks for
(pip, setuptools, wheel at its pinned versions) from the configured index.
"""

import subprocess
import sys


def main():
    # --no-setuptools / --no-wheel are options of get-pip.py itself, not of pip install.
    args = [arg for arg in sys.argv[1:] if arg not in ('--no-setuptools', '--no-wheel')]
    subprocess.check_call([sys.executable, '-m', 'ensurepip', '--default-pip'], stdout=subprocess.DEVNULL)
    subprocess.check_call([sys.executable, '-m', 'pip', 'install', '--quiet'] + args)


if __name__ == '__main__':
    main()
