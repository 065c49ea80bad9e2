# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: credentials and the HTTP connection to the API server.
#
# Credentials come from the `kubernetes` client's loaders (kubeconfig file or dict, context, in-cluster service
# account), so every auth method it knows works here. The requests themselves go through urllib3 (which `kubernetes`
# depends on) and are parsed as plain JSON: the node watch must stay cheap at thousands of nodes, and the typed
# models' deserialisation costs more than the whole wait; plain dicts also keep this code independent of the
# generated client's call signatures, which changed across releases.

from __future__ import annotations

import json
import os
import random
import time
from urllib.parse import urlencode

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import (
    ConnectionSetupError,
    KubeApiError,
    KubeTransportError,
    WatchGone,
    WatchInterrupted,
)

try:
    import urllib3
    from kubernetes import config as kube_config
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError as Urllib3HTTPError
    from urllib3.exceptions import SSLError as Urllib3SSLError
except ImportError as import_error:
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = import_error

    # Stand-ins that nothing raises, so the except clauses below stay valid; run_module stops before any use.
    class ConfigException(Exception):
        pass

    class Urllib3HTTPError(Exception):
        pass

    class Urllib3SSLError(Urllib3HTTPError):
        pass

else:
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None

try:
    from yaml import YAMLError
except ImportError:

    class YAMLError(Exception):
        pass


RETRY_STATUSES = (429, 500, 502, 503, 504)
USER_AGENT = "kubegpu.node/nvidia_device_plugin"
DEFAULT_KUBECONFIG = "~/.kube/config"
BACKOFF_BASE = 0.5
BACKOFF_CAP = 10.0
TRANSPORT_RETRIES = 3


def _bearer(token: str) -> str:
    return token if token.lower().startswith("bearer ") else "Bearer " + token


def load_configuration(params: dict, environ=None) -> tuple:
    """Build a kubernetes Configuration from the module's auth options.

    Returns (configuration, source): source names where the credentials came from, for messages.
    Order: host + credentials; an explicit kubeconfig (path or dict); $KUBECONFIG or ~/.kube/config; in-cluster.
    """
    environ = os.environ if environ is None else environ
    cfg = Configuration()
    source = ""
    kubeconfig = params.get("kubeconfig")
    context = params.get("context")
    try:
        if params.get("host"):
            cfg.host = params["host"]
            source = f"host {params['host']}"
            if params.get("api_key"):
                cfg.api_key = {"authorization": _bearer(params["api_key"])}
        elif isinstance(kubeconfig, dict):
            kube_config.load_kube_config_from_dict(kubeconfig, context=context, client_configuration=cfg)
            source = "kubeconfig (dict)"
        elif kubeconfig:
            path = os.path.expanduser(str(kubeconfig))
            if not os.path.isfile(path):
                raise ConnectionSetupError(f"kubeconfig {path} does not exist or is not a file")
            kube_config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
            source = f"kubeconfig {path}"
        elif environ.get("KUBECONFIG") or os.path.isfile(os.path.expanduser(DEFAULT_KUBECONFIG)):
            kube_config.load_kube_config(context=context, client_configuration=cfg)
            source = f"kubeconfig {environ.get('KUBECONFIG') or DEFAULT_KUBECONFIG}"
        elif environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=cfg)
            source = "in-cluster service account"
        else:
            raise ConnectionSetupError(
                "no cluster credentials: set kubeconfig, or host with api_key, or $KUBECONFIG, "
                "or run inside a pod with a service account"
            )
    except (ConfigException, YAMLError, OSError, ValueError, KeyError, TypeError) as error:
        raise ConnectionSetupError(f"could not load cluster credentials: {error}") from None

    if params.get("ca_cert"):
        cfg.ssl_ca_cert = params["ca_cert"]
    if params.get("client_cert"):
        cfg.cert_file = params["client_cert"]
        cfg.key_file = params.get("client_key")
    if params.get("validate_certs") is not None:
        cfg.verify_ssl = bool(params["validate_certs"])
    if params.get("proxy"):
        cfg.proxy = params["proxy"]
    for option, path in (("ca_cert", cfg.ssl_ca_cert), ("client_cert", cfg.cert_file), ("client_key", cfg.key_file)):
        if path and not os.path.isfile(path):
            raise ConnectionSetupError(f"{option}: {path} does not exist or is not a file")
    if not cfg.host:
        raise ConnectionSetupError(f"no API server address in {source}")
    return cfg, source


def retry_after_seconds(headers) -> float | None:
    """The Retry-After header in seconds (the API server sends whole seconds), or None when absent or unusable."""
    value = (headers or {}).get("Retry-After") if headers is not None else None
    if value is None:
        return None
    value = str(value).strip()
    if not value.isdigit():
        return None
    return float(int(value))


def retry_delay(attempt: int, retry_after: float | None, rng=random.random) -> float:
    """How long to wait before attempt ``attempt + 1``.

    A server's Retry-After is a floor (API Priority and Fairness asks for it when a priority level is full): the
    delay is that many seconds plus up to 10 % jitter, never less. Without it, exponential backoff from BACKOFF_BASE,
    doubling up to BACKOFF_CAP, with "equal jitter" (half fixed, half random), so that many clients that failed
    together do not come back together, and none comes back at once.
    """
    if retry_after is not None:
        return retry_after * (1.0 + 0.1 * rng())
    ceiling = min(BACKOFF_CAP, BACKOFF_BASE * (2 ** max(0, attempt - 1)))
    return ceiling / 2 + rng() * ceiling / 2


class KubeClient:
    """A small JSON client for the few API paths this module uses; it counts the requests it makes.

    Every call retries 429, 5xx and broken connections with ``retry_delay`` until its deadline: the ``deadline``
    argument (a ``clock()`` value), else ``retry_window`` seconds from the call's start. ``clock``, ``sleep`` and
    ``rng`` are parameters so that tests control time.
    """

    def __init__(
        self,
        configuration,
        sleep=time.sleep,
        clock=time.monotonic,
        rng=random.random,
        retry_window: float = 60.0,
    ):
        self._cfg = configuration
        self.base = configuration.host.rstrip("/")
        self._sleep = sleep
        self.clock = clock
        self._rng = rng
        self.retry_window = retry_window
        self.request_count = 0
        self.throttled_count = 0
        self.verify = bool(configuration.verify_ssl)
        pool_args: dict = {"num_pools": 2, "maxsize": 4}
        if self.base.startswith("https://"):
            pool_args["cert_reqs"] = "CERT_REQUIRED" if self.verify else "CERT_NONE"
            if configuration.ssl_ca_cert:
                pool_args["ca_certs"] = configuration.ssl_ca_cert
            if configuration.cert_file:
                pool_args["cert_file"] = configuration.cert_file
            if configuration.key_file:
                pool_args["key_file"] = configuration.key_file
            if getattr(configuration, "tls_server_name", None):
                pool_args["server_hostname"] = configuration.tls_server_name
            if not self.verify:
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        if configuration.proxy:
            self._pool = urllib3.ProxyManager(configuration.proxy, **pool_args)
        else:
            self._pool = urllib3.PoolManager(**pool_args)

    def _headers(self, content_type: str | None = None) -> dict:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        # auth_settings() is the client's own view of its credentials across releases (the key holding the token
        # moved from 'authorization' to 'BearerToken'); it also runs the refresh hook of expiring tokens.
        for setting in (self._cfg.auth_settings() or {}).values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting.get("key") or "authorization"] = setting["value"]
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _url(self, path: str, query: dict | None) -> str:
        if not query:
            return self.base + path
        return self.base + path + "?" + urlencode([(k, v) for k, v in query.items() if v is not None])

    def _transport_error(self, error, method: str, path: str):
        if isinstance(error, Urllib3SSLError):
            hint = (
                "set ca_cert to the CA that signed the API server's certificate"
                if self.verify
                else "check client_cert and client_key"
            )
            return KubeTransportError(f"TLS connection to {self.base} failed: {error}; {hint}", url=self.base)
        return KubeTransportError(
            f"cannot reach the API server at {self.base} ({method} {path}): {error}", url=self.base
        )

    def _send(self, method: str, url: str, read_timeout: float, data=None, content_type=None, stream: bool = False):
        """One counted HTTP exchange; urllib3's own retries are off, callers decide what is worth retrying.

        Without ``stream`` the whole body is read (error bodies too), so the connection goes back to the pool clean.
        """
        self.request_count += 1
        return self._pool.request(
            method,
            url,
            body=data,
            headers=self._headers(content_type),
            timeout=urllib3.Timeout(connect=min(10.0, read_timeout), read=read_timeout),
            retries=False,
            preload_content=not stream,
        )

    def pause(self, attempt: int, retry_after: float | None, deadline: float) -> bool:
        """Sleep before a retry; False (without sleeping) when the retry could not start before ``deadline``."""
        delay = retry_delay(attempt, retry_after, self._rng)
        if self.clock() + delay >= deadline:
            return False
        self._sleep(delay)
        return True

    def request(
        self,
        method: str,
        path: str,
        query: dict | None = None,
        body=None,
        content_type=None,
        timeout=30.0,
        deadline: float | None = None,
    ):
        """One API call, retried on 429/5xx and broken connections until the deadline; returns the parsed JSON."""
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            content_type = content_type or "application/json"
        url = self._url(path, query)
        if deadline is None:
            deadline = self.clock() + self.retry_window
        attempt = 0
        while True:
            attempt += 1
            read_timeout = max(0.1, min(timeout, deadline - self.clock()))
            try:
                response = self._send(method, url, read_timeout, data, content_type)
            except Urllib3SSLError as error:
                raise self._transport_error(error, method, path) from None
            except Urllib3HTTPError as error:
                # A refused or reset connection is retried a few times only: a server that is not there stays so.
                if attempt <= TRANSPORT_RETRIES and self.pause(attempt, None, deadline):
                    continue
                raise self._transport_error(error, method, path) from None
            if 200 <= response.status < 300:
                return json.loads(response.data) if response.data else {}
            if response.status in RETRY_STATUSES:
                if response.status == 429:
                    self.throttled_count += 1
                if self.pause(attempt, retry_after_seconds(response.headers), deadline):
                    continue
            raise KubeApiError(response.status, response.reason, method, path, response.data)

    def get_or_none(self, path: str, query: dict | None = None, deadline: float | None = None):
        try:
            return self.request("GET", path, query, deadline=deadline)
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def get_text(self, path: str, query: dict | None = None, timeout: float = 10.0) -> str:
        """A plain-text answer (pod logs); no retries: logs only enrich a diagnosis."""
        try:
            response = self._send("GET", self._url(path, query), timeout)
        except Urllib3HTTPError as error:
            raise self._transport_error(error, "GET", path) from None
        if response.status != 200:
            raise KubeApiError(response.status, response.reason, "GET", path, response.data)
        return response.data.decode("utf-8", "replace")

    def watch(self, path: str, query: dict, timeout: float):
        """Yield watch events (dicts) until the stream ends or ``timeout`` seconds pass, whatever the server sends.

        The server is asked to end the watch by then (timeoutSeconds), and the client ends it itself at that time too
        (a server or proxy may ignore timeoutSeconds, or keep the stream alive with bookmarks or blank lines).
        WatchGone on 410; WatchInterrupted (with the server's Retry-After, if any) on 429/5xx or a broken stream.
        """
        deadline = self.clock() + timeout
        query = dict(query, watch="true", allowWatchBookmarks="true", timeoutSeconds=max(1, int(timeout)))
        try:
            response = self._send("GET", self._url(path, query), max(0.1, timeout), stream=True)
        except Urllib3SSLError as error:
            raise self._transport_error(error, "GET", path) from None
        except Urllib3HTTPError as error:
            raise WatchInterrupted(str(error)) from None
        finished = False
        try:
            if response.status != 200:
                # Read the error body now, so that the connection is clean when it goes back to the pool.
                body = response.read(decode_content=True)
                finished = True
                if response.status == 410:
                    raise WatchGone()
                if response.status in RETRY_STATUSES:
                    if response.status == 429:
                        self.throttled_count += 1
                    raise WatchInterrupted(f"HTTP {response.status}", retry_after=retry_after_seconds(response.headers))
                raise KubeApiError(response.status, response.reason, "GET", path, body)
            buffer = b""
            for chunk in self._chunks(response):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield self._parse_event(line)
                if self.clock() >= deadline:
                    # Past the deadline while the server still sends (bookmarks, blank lines): end it here.
                    return
            finished = True
            if buffer.strip():
                yield self._parse_event(buffer)
        except (Urllib3HTTPError, OSError) as error:
            raise WatchInterrupted(str(error)) from None
        finally:
            if not finished:
                # A stream left unread (the caller stopped, the deadline passed, the stream broke) must not go back
                # to the pool: the next request on it would read the rest of this stream as its answer.
                response.close()
            response.release_conn()

    @staticmethod
    def _chunks(response):
        if response.chunked and response.supports_chunked_reads():
            yield from response.read_chunked(decode_content=True)
            return
        read1 = getattr(response, "read1", None)
        while True:
            data = read1(65536) if read1 is not None else response.read(1024)
            if not data:
                return
            yield data

    @staticmethod
    def _parse_event(line: bytes) -> dict:
        try:
            event = json.loads(line)
        except ValueError:
            raise WatchInterrupted("unparsable watch event") from None
        if event.get("type") == "ERROR":
            status = event.get("object") or {}
            if status.get("code") == 410:
                raise WatchGone()
            raise WatchInterrupted(str(status.get("message") or status))
        return event
