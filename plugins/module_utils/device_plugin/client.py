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
    if params.get("validate_certs") is False:
        cfg.verify_ssl = False
    if params.get("proxy"):
        cfg.proxy = params["proxy"]
    for option, path in (("ca_cert", cfg.ssl_ca_cert), ("client_cert", cfg.cert_file), ("client_key", cfg.key_file)):
        if path and not os.path.isfile(path):
            raise ConnectionSetupError(f"{option}: {path} does not exist or is not a file")
    if not cfg.host:
        raise ConnectionSetupError(f"no API server address in {source}")
    return cfg, source


class KubeClient:
    """A small JSON client for the few API paths this module uses; it counts the requests it makes."""

    def __init__(self, configuration, sleep=time.sleep, retries: int = 3, backoff: float = 0.5):
        self._cfg = configuration
        self.base = configuration.host.rstrip("/")
        self._sleep = sleep
        self._retries = retries
        self._backoff = backoff
        self.request_count = 0
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
        """One counted HTTP exchange; urllib3's own retries are off, callers decide what is worth retrying."""
        self.request_count += 1
        return self._pool.request(
            method,
            url,
            body=data,
            headers=self._headers(content_type),
            timeout=urllib3.Timeout(connect=10.0, read=read_timeout),
            retries=False,
            preload_content=not stream,
        )

    def request(self, method: str, path: str, query: dict | None = None, body=None, content_type=None, timeout=30.0):
        """One API call with retries on 429/5xx and on connection errors; returns the parsed JSON answer."""
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            content_type = content_type or "application/json"
        url = self._url(path, query)
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._send(method, url, timeout, data, content_type)
            except Urllib3SSLError as error:
                raise self._transport_error(error, method, path) from None
            except Urllib3HTTPError as error:
                if attempt <= self._retries:
                    self._sleep(self._backoff * attempt)
                    continue
                raise self._transport_error(error, method, path) from None
            if 200 <= response.status < 300:
                return json.loads(response.data) if response.data else {}
            if response.status in RETRY_STATUSES and attempt <= self._retries:
                self._sleep(self._retry_delay(response, attempt))
                continue
            raise KubeApiError(response.status, response.reason, method, path, response.data)

    def _retry_delay(self, response, attempt: int) -> float:
        retry_after = response.headers.get("Retry-After") if response.headers else None
        if retry_after and retry_after.isdigit():
            return min(float(retry_after), 5.0)
        return self._backoff * attempt

    def get_or_none(self, path: str, query: dict | None = None):
        try:
            return self.request("GET", path, query)
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
        """Yield watch events (dicts) until the stream ends; WatchGone on 410, WatchInterrupted on a broken stream."""
        query = dict(query, watch="true", allowWatchBookmarks="true", timeoutSeconds=max(1, int(timeout)))
        try:
            response = self._send("GET", self._url(path, query), timeout + 5.0, stream=True)
        except Urllib3SSLError as error:
            raise self._transport_error(error, "GET", path) from None
        except Urllib3HTTPError as error:
            raise WatchInterrupted(str(error)) from None
        try:
            if response.status == 410:
                raise WatchGone()
            if response.status in RETRY_STATUSES:
                raise WatchInterrupted(f"HTTP {response.status}")
            if response.status != 200:
                raise KubeApiError(response.status, response.reason, "GET", path, response.read())
            buffer = b""
            for chunk in self._chunks(response):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield self._parse_event(line)
            if buffer.strip():
                yield self._parse_event(buffer)
        except (Urllib3HTTPError, OSError) as error:
            raise WatchInterrupted(str(error)) from None
        finally:
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
