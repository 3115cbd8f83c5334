"""A managed Redis as production reaches it: TLS (`rediss://`) with the provider's CA and a
password holding characters a URL must encode, written as docs/production.md prints it; the
service stores and delivers through it, and the plain port is never used."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import orjson
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from blackbox.dev.servers import RedisServer, free_port
from tests.integration.conftest import ReaderFactory, ServiceFactory
from tests.kafkatools import envelope, produce, unique

PASSWORD = "s3cr#t/p?w"  # noqa: S105 - a test's own Redis
ENCODED = "s3cr%23t%2Fp%3Fw"  # the same, percent-encoded for the URL


def _pem(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA of its own and a server certificate it signed for 127.0.0.1: (CA, cert, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "redis")]))
              .issuer_name(ca_name).public_key(key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName(
                  [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .sign(ca_key, hashes.SHA256()))  # fmt: skip
    pem = serialization.Encoding.PEM
    private = key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    return (_pem(folder / "ca.pem", ca.public_bytes(pem)),
            _pem(folder / "redis.pem", server.public_bytes(pem)),
            _pem(folder / "redis.key", private))  # fmt: skip


def test_the_service_stores_and_delivers_through_a_redis_over_tls_with_a_password(
    start_service: ServiceFactory, reader: ReaderFactory, tmp_path: Path
) -> None:
    """Guarantee 1 on a managed-style Redis: REDIS_URL=rediss://:<encoded password>@host:port/0
    ?ssl_ca_certs=<the provider's CA> connects over TLS, authenticates, stores the schedule
    and delivers it; the Redis saw commands on its TLS port only."""
    ca, cert, key = _certificates(tmp_path)
    tls_port = free_port()
    server = RedisServer(free_port(), tmp_path, config={
        "tls-port": str(tls_port), "tls-cert-file": str(cert), "tls-key-file": str(key),
        "tls-ca-cert-file": str(ca), "tls-auth-clients": "no", "requirepass": PASSWORD,
    })  # fmt: skip
    server.start()
    try:
        url = f"rediss://:{ENCODED}@127.0.0.1:{tls_port}/0?ssl_ca_certs={ca}"
        service = start_service(REDIS_URL=url)
        target = unique("orders")
        caller = [("CALLER_SERVICE", b"shop")]
        produce(service.settings.kafka["bootstrap.servers"], service.settings.intake_topic,
                [envelope(target, {"order": 7}, 1)], headers=caller)  # fmt: skip
        (record,) = reader(target).wait_count(1, timeout=60)
        assert orjson.loads(record.value or b"") == {"order": 7}
        plain = redis.Redis(port=server.port, password=PASSWORD)
        others = [c["laddr"] for c in plain.client_list() if c["cmd"] != "client|list"]
        plain.close()
        assert others and set(others) == {f"127.0.0.1:{tls_port}"}, others
    finally:
        server.stop()
