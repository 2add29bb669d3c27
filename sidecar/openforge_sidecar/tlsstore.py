"""mitmproxy's TLS addon, with its certificate authority loaded once, and only when it is used.

mitmproxy's ``tlsconfig`` addon loads the CA from the confdir whenever its
options are configured, creating one (an RSA key and five files) when the
confdir has none, and loads it again when the proxy starts running. The CA
signs the certificates the proxy shows clients whose TLS it intercepts,
nothing else: upstream TLS does not use it.

- In reverse mode (BaseURL capture) a harness speaks plain HTTP to the
  sidecar and the CA is never used, yet creating it cost every rollout pod
  0.15 s of its start, before it served. Here the store is built the first
  time a certificate is needed; a confdir that is never used stays empty.
- In the other modes (Proxy, Transparent) every harness call needs the CA:
  it is loaded while the options are configured, as mitmproxy does, so a
  bad CA file stops the sidecar at start with mitmproxy's own error. The
  second load when the proxy starts (a mitmproxy workaround) is skipped,
  since the store is current.

Import this module only after :func:`openforge_sidecar.master.build` has set
up ``mitmproxy.addons`` (it imports ``mitmproxy.addons.tlsconfig``).
"""

from __future__ import annotations

from typing import Any

from mitmproxy import certs, ctx
from mitmproxy.addons import tlsconfig

#: The options from which mitmproxy's addon builds its certificate store.
STORE_OPTIONS = frozenset({"certs", "confdir", "key_size", "cert_passphrase"})


def intercepts_client_tls(modes: list[str]) -> bool:
    """Whether a proxy of these mode specs needs its CA for every client (pure).

    Reverse mode to a plain-HTTP upstream, the rollout pod's BaseURL capture,
    does not: a client would have to open TLS to the sidecar itself.
    """
    return not all(mode.startswith("reverse:http://") for mode in modes)


class TlsConfig(tlsconfig.TlsConfig):
    """``tlsconfig.TlsConfig`` whose certificate store is built when the first certificate is
    needed.

    Every use of the store goes through :meth:`get_cert` (the TLS and QUIC
    client-side hooks call it first). ``certstore`` is None until then.
    """

    def configure(self, updated: set[str]) -> None:
        if updated & STORE_OPTIONS:
            self.certstore = None  # type: ignore[assignment]  # mitmproxy's own "not loaded yet"
            if intercepts_client_tls(list(ctx.options.mode)):
                self._load_store()  # now: a bad CA is an error at start
        super().configure(set(updated) - STORE_OPTIONS)  # type: ignore[no-untyped-call]

    def get_cert(self, conn_context: Any) -> certs.CertStoreEntry:
        self._load_store()
        return super().get_cert(conn_context)

    def running(self) -> None:
        """Nothing: the store is current (mitmproxy's addon loads it again here)."""

    def _load_store(self) -> None:
        if self.certstore is None:
            super().configure(STORE_OPTIONS)  # mitmproxy's loading, checks, warnings
