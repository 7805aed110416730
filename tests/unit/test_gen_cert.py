"""Tests for tools/gen_cert.py: the certificate must be usable for real TLS.

The module is loaded from its file path because ``tools/`` is a folder of
scripts, not a package.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib.util
import ipaddress
import os
import ssl
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tools" / "gen_cert.py"

EXTRA_DNS = "media.example.test"
EXTRA_IPV4 = "192.168.77.5"
EXTRA_IPV6 = "fd00::5"

_IpSan = ipaddress.IPv4Address | ipaddress.IPv6Address | ipaddress.IPv4Network | ipaddress.IPv6Network


def _load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cert", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_cert = _load_module()


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _load_key(path: Path) -> rsa.RSAPrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    return key


def _sans(cert: x509.Certificate) -> tuple[set[str], set[_IpSan]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        set(ext.get_values_for_type(x509.DNSName)),
        set(ext.get_values_for_type(x509.IPAddress)),
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """A permissive umask proves the code sets modes itself instead of relying
    on the caller's umask to hide the key."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture(scope="module")
def cert_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One pair shared by the read-only tests; RSA keygen is the slow part."""
    out = tmp_path_factory.mktemp("shared-cert")
    return gen_cert.generate_self_signed(out, [EXTRA_DNS, EXTRA_IPV4, EXTRA_IPV6])  # type: ignore[no-any-return]


# --- generate_self_signed() -------------------------------------------------


def test_function_writes_files_in_requested_dir(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "certs"
    cert_path, key_path = gen_cert.generate_self_signed(out)
    assert cert_path == out / "cert.pem"
    assert key_path == out / "key.pem"
    assert cert_path.is_file() and key_path.is_file()
    assert sorted(p.name for p in out.iterdir()) == ["cert.pem", "key.pem"]


def test_default_dir_is_repo_certs() -> None:
    assert gen_cert.DEFAULT_CERT_DIR == REPO_ROOT / "certs"


def test_sans_include_defaults_and_extras(cert_pair: tuple[Path, Path]) -> None:
    dns, ips = _sans(_load_cert(cert_pair[0]))
    assert dns == {"localhost", EXTRA_DNS}
    assert ips == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address(EXTRA_IPV4),
        ipaddress.ip_address(EXTRA_IPV6),
    }


def test_default_sans_without_extras(tmp_path: Path) -> None:
    cert_path, _ = gen_cert.generate_self_signed(tmp_path)
    cert = _load_cert(cert_path)
    dns, ips = _sans(cert)
    assert dns == {"localhost"}
    assert ips == {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in cn] == ["localhost"]


def test_duplicate_and_uppercase_names_are_normalised(tmp_path: Path) -> None:
    cert_path, _ = gen_cert.generate_self_signed(tmp_path, ["LocalHost", "Media.Example.Test", "127.0.0.1"])
    ext = _load_cert(cert_path).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    names = ext.value.get_values_for_type(x509.DNSName)
    assert sorted(names) == ["localhost", "media.example.test"]
    assert len(ext.value.get_values_for_type(x509.IPAddress)) == 2


def test_certificate_fields(cert_pair: tuple[Path, Path]) -> None:
    cert = _load_cert(cert_pair[0])
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in cn] == [EXTRA_DNS]
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)  # self-signed: raises if not

    public_key = cert.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    assert public_key.key_size == 2048
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)

    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.value.ca is False
    assert basic.critical is True

    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature is True
    assert usage.key_encipherment is True
    assert usage.key_cert_sign is False
    assert usage.crl_sign is False

    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_validity_window_default(cert_pair: tuple[Path, Path]) -> None:
    cert = _load_cert(cert_pair[0])
    now = datetime.datetime.now(datetime.UTC)
    start = cert.not_valid_before_utc
    end = cert.not_valid_after_utc
    # Back-dated by one minute (generous upper bound for slow test machines).
    assert now - datetime.timedelta(minutes=10) < start < now
    assert end - start == datetime.timedelta(days=825, minutes=1)


def test_custom_days(tmp_path: Path) -> None:
    cert_path, _ = gen_cert.generate_self_signed(tmp_path, days_valid=30)
    cert = _load_cert(cert_path)
    span = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert span == datetime.timedelta(days=30, minutes=1)


def test_key_matches_certificate(cert_pair: tuple[Path, Path]) -> None:
    cert_path, key_path = cert_pair
    cert = _load_cert(cert_path)
    key = _load_key(key_path)
    der = serialization.Encoding.DER
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(der, spki) == cert.public_key().public_bytes(der, spki)
    # And prove it operationally: a signature by the key verifies with the cert.
    message = b"mediaserver"
    signature = key.sign(message, padding.PKCS1v15(), hashes.SHA256())
    cert_public = cert.public_key()
    assert isinstance(cert_public, rsa.RSAPublicKey)
    cert_public.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())


@pytest.mark.usefixtures("umask_zero")
def test_file_modes_with_permissive_umask(tmp_path: Path) -> None:
    cert_path, key_path = gen_cert.generate_self_signed(tmp_path)
    assert _mode(key_path) == 0o600
    assert _mode(cert_path) == 0o644


def test_file_modes_with_strict_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        cert_path, key_path = gen_cert.generate_self_signed(tmp_path)
    finally:
        os.umask(old)
    assert _mode(key_path) == 0o600
    assert _mode(cert_path) == 0o644


def test_overwrite_tightens_loose_existing_key_mode(tmp_path: Path) -> None:
    key_path = tmp_path / "key.pem"
    key_path.write_text("old")
    key_path.chmod(0o666)
    gen_cert.generate_self_signed(tmp_path)
    assert _mode(key_path) == 0o600
    assert key_path.read_text() != "old"


def test_no_temp_files_left_behind(tmp_path: Path) -> None:
    gen_cert.generate_self_signed(tmp_path)
    gen_cert.generate_self_signed(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cert.pem", "key.pem"]


def test_function_refuses_overwrite_when_asked(tmp_path: Path) -> None:
    cert_path, key_path = gen_cert.generate_self_signed(tmp_path)
    before = (cert_path.read_bytes(), key_path.read_bytes())
    with pytest.raises(FileExistsError):
        gen_cert.generate_self_signed(tmp_path, overwrite=False)
    assert (cert_path.read_bytes(), key_path.read_bytes()) == before


@pytest.mark.parametrize(
    "hostnames",
    [[""], ["bad host"], [" padded"], ["a..b"], ["-lead.example"], ["127.1"]],
)
def test_function_rejects_bad_hostnames(tmp_path: Path, hostnames: list[str]) -> None:
    with pytest.raises(ValueError):
        gen_cert.generate_self_signed(tmp_path / "out", hostnames)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("days", [0, -5])
def test_function_rejects_bad_days(tmp_path: Path, days: int) -> None:
    with pytest.raises(ValueError):
        gen_cert.generate_self_signed(tmp_path / "out", days_valid=days)
    assert not (tmp_path / "out").exists()


def test_function_rejects_small_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        gen_cert.generate_self_signed(tmp_path / "out", key_size_bits=1024)
    assert not (tmp_path / "out").exists()


# --- TLS usability -------------------------------------------------------------


def _server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


def _client_context(cert_path: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert ctx.check_hostname is True
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    # Python 3.13+ default contexts verify strictly; make sure we would pass.
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(cafile=cert_path)
    return ctx


def test_ssl_context_accepts_pair(cert_pair: tuple[Path, Path]) -> None:
    _server_context(*cert_pair)  # raises ssl.SSLError on a mismatched pair


def test_ssl_context_rejects_mismatched_pair(tmp_path: Path) -> None:
    """Guards the test above: load_cert_chain really does check the pairing."""
    cert_a, _ = gen_cert.generate_self_signed(tmp_path / "a")
    _, key_b = gen_cert.generate_self_signed(tmp_path / "b")
    with pytest.raises(ssl.SSLError):
        _server_context(cert_a, key_b)


async def _handshake(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_hostname: str
) -> tuple[bytes, dict[str, object]]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    async with server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname=server_hostname),
            timeout=10,
        )
        try:
            peercert = writer.get_extra_info("peercert")
            writer.write(b"ping\n")
            await writer.drain()
            reply = await asyncio.wait_for(reader.readline(), timeout=10)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()
    return reply, peercert


@pytest.mark.parametrize("server_hostname", ["localhost", "127.0.0.1", EXTRA_DNS])
def test_real_tls_handshake(cert_pair: tuple[Path, Path], server_hostname: str) -> None:
    cert_path, key_path = cert_pair
    reply, peercert = asyncio.run(
        _handshake(
            _server_context(cert_path, key_path),
            _client_context(cert_path),
            server_hostname,
        )
    )
    assert reply == b"ping\n"
    assert ("DNS", "localhost") in peercert["subjectAltName"]  # type: ignore[operator]


def test_tls_handshake_rejects_unlisted_hostname(cert_pair: tuple[Path, Path]) -> None:
    """Guards the handshake test: hostname checking is really in effect."""
    cert_path, key_path = cert_pair
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(
            _handshake(
                _server_context(cert_path, key_path),
                _client_context(cert_path),
                "not-in-cert.example",
            )
        )


# --- command line ----------------------------------------------------------------


def test_cli_writes_pair_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    result = _run_cli("--dir", str(out), EXTRA_DNS, EXTRA_IPV4, EXTRA_IPV6)
    assert result.returncode == 0, result.stderr
    cert_path, key_path = out / "cert.pem", out / "key.pem"
    assert str(cert_path) in result.stdout
    assert str(key_path) in result.stdout
    for san in ("DNS:localhost", "IP:127.0.0.1", "IP:::1", f"DNS:{EXTRA_DNS}"):
        assert san in result.stdout
    assert f"IP:{EXTRA_IPV4}" in result.stdout

    dns, ips = _sans(_load_cert(cert_path))
    assert dns == {"localhost", EXTRA_DNS}
    assert ips == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address(EXTRA_IPV4),
        ipaddress.ip_address(EXTRA_IPV6),
    }
    assert _mode(key_path) == 0o600
    assert _mode(cert_path) == 0o644
    _server_context(cert_path, key_path)


def test_cli_days(tmp_path: Path) -> None:
    result = _run_cli("--dir", str(tmp_path), "--days", "10")
    assert result.returncode == 0, result.stderr
    cert = _load_cert(tmp_path / "cert.pem")
    span = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert span == datetime.timedelta(days=10, minutes=1)


@pytest.mark.parametrize("existing", [("cert.pem", "key.pem"), ("key.pem",), ("cert.pem",)])
def test_cli_refuses_overwrite_without_force(tmp_path: Path, existing: tuple[str, ...]) -> None:
    for name in existing:
        (tmp_path / name).write_bytes(b"precious " + name.encode())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    result = _run_cli("--dir", str(tmp_path))

    assert result.returncode == 1
    assert "refusing to overwrite" in result.stderr
    assert "--force" in result.stderr
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before


def test_cli_refusal_keeps_generated_pair(tmp_path: Path) -> None:
    assert _run_cli("--dir", str(tmp_path)).returncode == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = _run_cli("--dir", str(tmp_path), EXTRA_DNS)
    assert result.returncode == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_cli_force_overwrites(tmp_path: Path) -> None:
    assert _run_cli("--dir", str(tmp_path)).returncode == 0
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    old_cert, old_key = cert_path.read_bytes(), key_path.read_bytes()

    result = _run_cli("--dir", str(tmp_path), "--force", EXTRA_DNS)

    assert result.returncode == 0, result.stderr
    assert cert_path.read_bytes() != old_cert
    assert key_path.read_bytes() != old_key
    dns, _ = _sans(_load_cert(cert_path))
    assert EXTRA_DNS in dns
    assert _mode(key_path) == 0o600
    _server_context(cert_path, key_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", ""], "empty"),
        (["bad host"], "whitespace"),
        (["a..b"], "not a valid DNS name"),
        (["127.1"], "neither a valid IP address"),
        (["--days", "0"], "--days"),
        (["--days", "-3"], "--days"),
        (["--days", "soon"], "--days"),
    ],
)
def test_cli_invalid_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    result = _run_cli("--dir", str(out), *args)
    assert result.returncode == 2
    assert "error:" in result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert not out.exists()
