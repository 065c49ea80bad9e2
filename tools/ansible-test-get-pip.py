"""Local replacement for the pip bootstrap script that `ansible-test --venv` downloads.

ansible-test creates each sanity test's virtual environment without pip and then runs a `get-pip` script fetched from
a host that the CI machines cannot reach. This script does the same job with what is reachable: pip from the
interpreter's own `ensurepip`, then the exact pip that ansible-test asked for, from PyPI.
"""

import subprocess
import sys

# ansible-test passes pip-install arguments (e.g. `pip==24.2`) plus get-pip's own --no-setuptools / --no-wheel.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}

subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"], stdout=subprocess.DEVNULL)
subprocess.check_call(
    [sys.executable, "-m", "pip", "install", "--quiet"] + [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
)
