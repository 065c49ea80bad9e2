"""aptrepo: signed Debian package repositories of stand-in packages, built and served for tests (a stand-in only).

``python -m aptrepo build SPEC OUT`` builds the packages a spec lists with ``dpkg-deb``, indexes them with
``apt-ftparchive`` and signs them with a throwaway gpg key (``InRelease`` and ``Release.gpg``), twice: once with
the key it publishes (``OUT/good``) and once with another key (``OUT/wrong-key``). ``python -m aptrepo serve
start|stop`` serves ``OUT`` over HTTP to the test containers. See tests/README.md.
"""

from __future__ import annotations
