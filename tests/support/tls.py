"""A certificate authority of the test's own and a server certificate it signed, for an HTTPS loopback index;
and a CONNECT proxy on loopback, to reach that index through.

Made with the ``cryptography`` package where it is installed, else with the ``openssl`` command; the server
certificate names 127.0.0.1 and localhost. Nothing outside the folder given is touched.
"""

from __future__ import annotations

import datetime as dt
import select
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path      # the CA's certificate (PEM): the one file a client must trust
    cert: Path    # the server's certificate (PEM), signed by the CA
    key: Path     # the server's private key (PEM)


def make_pki(folder: Path, *, via: str | None = None) -> Pki:
    """A fresh CA and a server certificate under ``folder``; ``via`` forces "cryptography" or "openssl"."""
    folder.mkdir(parents=True, exist_ok=True)
    if via is None:
        try:
            import cryptography  # noqa: F401
            via = "cryptography"
        except ImportError:
            via = "openssl"
    pki = Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    (_with_cryptography if via == "cryptography" else _with_openssl)(pki)
    return pki


def _with_cryptography(pki: Pki) -> None:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hermetic test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                          x509.DNSName("localhost")]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))


def _with_openssl(pki: Pki) -> None:
    folder = pki.ca.parent
    ca_key, csr, ext = folder / "ca.key", folder / "server.csr", folder / "server.ext"
    ext.write_text("basicConstraints = critical, CA:FALSE\nextendedKeyUsage = serverAuth\n"
                   "subjectAltName = IP:127.0.0.1, DNS:localhost\n")

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", ca_key, "-out", pki.ca, "-days", "1", "-subj", "/CN=hermetic test CA",
            "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", pki.key, "-out", csr, "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", csr, "-CA", pki.ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
            "-extfile", ext, "-out", pki.cert)


@contextmanager
def connect_proxy() -> Iterator[tuple[str, list[str]]]:
    """An HTTP proxy on 127.0.0.1 that tunnels CONNECT requests (and refuses anything else): its URL, and
    the ``host:port`` of every tunnel it opened."""
    tunnels: list[str] = []

    class Tunnel(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            request = self.rfile.readline().decode("latin-1").split()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            if len(request) < 2 or request[0] != "CONNECT":
                self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            host, port = request[1].rsplit(":", 1)
            tunnels.append(request[1])
            with socket.create_connection((host, int(port)), timeout=10) as upstream:
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                ends = [self.connection, upstream]
                while True:
                    ready, _, _ = select.select(ends, [], [], 10)
                    if not ready:
                        return
                    for end in ready:
                        data = end.recv(65536)
                        if not data:
                            return
                        (upstream if end is self.connection else self.connection).sendall(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Tunnel)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tunnels
    finally:
        server.shutdown()
        server.server_close()
