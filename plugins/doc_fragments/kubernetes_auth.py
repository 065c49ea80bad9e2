# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The connection options of this collection's Kubernetes modules (kubegpu.node.nvidia_device_plugin,
# kubegpu.node.gpu_health_node, kubegpu.node.dcgm_exporter): the same names, aliases and K8S_AUTH_* variables as
# kubernetes.core's, so that one set of values serves both.

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file, or the kubeconfig's content as a mapping.
      - Without it, and without O(host), the module uses E(KUBECONFIG) or C(~/.kube/config), then the in-cluster
        service account.
      - Can be set with E(K8S_AUTH_KUBECONFIG).
    type: raw
  context:
    description: Context of the kubeconfig to use. Can be set with E(K8S_AUTH_CONTEXT).
    type: str
  host:
    description:
      - URL of the API server, used with O(api_key) or O(client_cert) instead of a kubeconfig.
      - Can be set with E(K8S_AUTH_HOST).
    type: str
  api_key:
    description: Bearer token for O(host). Can be set with E(K8S_AUTH_API_KEY).
    type: str
  validate_certs:
    description:
      - Verify the API server's TLS certificate. Turning it off produces a warning.
      - When not set, the kubeconfig's C(insecure-skip-tls-verify) decides, and certificates are verified otherwise
        (as in kubernetes.core).
      - Can be set with E(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - Path to the CA certificate that signed the API server's certificate.
      - Can be set with E(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description: Path to a client certificate for TLS client authentication. Can be set with E(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description: Path to the key of O(client_cert). Can be set with E(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
  proxy:
    description: URL of an HTTP proxy to reach the API server through. Can be set with E(K8S_AUTH_PROXY).
    type: str
"""
