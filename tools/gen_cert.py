#!/usr/bin/env python3
"""Create a self-signed TLS certificate so the speech server can run over HTTPS.

Browsers only expose the microphone (``getUserMedia``) to secure contexts, so
any client that is not on ``localhost`` needs the server to speak HTTPS.  This
script produces a ``cert.pem``/``key.pem`` pair for that, using only the
``cryptography`` package so it works wherever the server's own dependencies
are installed (no ``openssl`` binary needed).

Choices, and why:

* RSA 2048 with SHA-256: the most widely accepted combination; every TLS
  client and every platform trust store handles it, which is what matters for
  a dev/LAN certificate.  EC P-256 would be smaller and faster but buys
  nothing noticeable here.
* Validity defaults to 825 days, the longest Apple platforms accept for a
  TLS server certificate even when the user trusts it manually.
* ``CA:FALSE`` plus ``serverAuth``: the file is meant to be trusted as a
  single endpoint certificate, never to sign other certificates, so a leaked
  key cannot be used to mint certificates for other sites.
* Subject/Authority Key Identifiers are included because RFC 5280 asks for
  them and some trust stores use them to match certificates; they cost nothing.

Usage::

    python tools/gen_cert.py [--dir DIR] [--days N] [--force] [hostname ...]

Extra hostnames are added to the certificate so LAN clients can connect by
name or address; an argument that parses as an IP address becomes an IP SAN.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CERT_FILENAME",
    "DEFAULT_CERT_DIR",
    "DEFAULT_DAYS_VALID",
    "KEY_FILENAME",
    "generate_self_signed",
    "main",
    "parse_hostname",
]

DEFAULT_CERT_DIR: Final[Path] = Path(__file__).resolve().parent.parent / "certs"
CERT_FILENAME: Final = "cert.pem"
KEY_FILENAME: Final = "key.pem"

DEFAULT_DAYS_VALID: Final = 825
# Apple clients reject TLS server certificates valid for longer than this.
MAX_ACCEPTED_DAYS: Final = 825
# Far beyond any useful lifetime, but keeps datetime arithmetic from overflowing.
MAX_DAYS: Final = 36500
MIN_KEY_SIZE_BITS: Final = 2048

KEY_FILE_MODE: Final = 0o600
CERT_FILE_MODE: Final = 0o644

# Back-dating absorbs small clock differences between server and clients.
_CLOCK_SKEW: Final = datetime.timedelta(minutes=1)
# X.520 upper bound for commonName; cryptography refuses longer values.
_MAX_CN_LENGTH: Final = 64

_DNS_LABEL_RE: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")

_DEFAULT_NAMES: Final[tuple[str, ...]] = ("localhost", "127.0.0.1", "::1")

_SanValue: TypeAlias = str | ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_hostname(raw: str) -> _SanValue:
    """Normalise one command-line name so bad input fails before any file is touched.

    Returns an IP address object for anything ``ipaddress`` accepts, otherwise a
    lower-cased DNS name.  Raises ``ValueError`` with a user-facing message.
    """
    name = raw.strip()
    if not name:
        raise ValueError("hostname must not be empty")
    if name != raw or any(ch.isspace() for ch in name):
        raise ValueError(f"hostname {raw!r} must not contain whitespace")

    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
            # An IP SAN is just the raw address bytes; a zone cannot be encoded.
            raise ValueError(
                f"IPv6 address {raw!r} has a zone/scope id, which cannot appear "
                "in a certificate; drop the '%...' suffix"
            )
        return address

    if not name.isascii():
        raise ValueError(f"hostname {raw!r} is not ASCII; pass its punycode (xn--) form instead")
    # A trailing dot only marks the name as fully qualified; SANs never carry it.
    dns = name.lower().removesuffix(".")
    if len(dns) > 253:
        raise ValueError(f"hostname {raw!r} is longer than 253 characters")
    labels = dns.split(".")
    for index, label in enumerate(labels):
        if index == 0 and label == "*" and len(labels) > 2:
            continue  # wildcard is only meaningful as the whole leftmost label
        if not _DNS_LABEL_RE.fullmatch(label):
            raise ValueError(
                f"hostname {raw!r} is not a valid DNS name (each dot-separated "
                "label must be 1-63 letters, digits or hyphens, not starting or "
                "ending with a hyphen)"
            )
    if labels[-1].isdigit():
        # "127.1" or "10.0.0.256" are typos for IP addresses, not host names.
        raise ValueError(f"{raw!r} is neither a valid IP address nor a DNS name")
    return dns


def _collect_sans(hostnames: Sequence[str]) -> list[_SanValue]:
    """Merge defaults with extras, dropping repeats, because duplicate SAN
    entries are legal but confuse anyone reading the certificate."""
    result: list[_SanValue] = []
    for raw in (*_DEFAULT_NAMES, *hostnames):
        value = parse_hostname(raw)
        if value not in result:
            result.append(value)
    return result


def _general_name(value: _SanValue) -> x509.GeneralName:
    if isinstance(value, str):
        return x509.DNSName(value)
    return x509.IPAddress(value)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write via a private temp file + rename so readers never see a partial file
    and the key is never readable by others, not even for an instant.

    The temp file is created with ``O_EXCL`` (so a pre-planted file or symlink
    cannot redirect the write) and with the final mode from the start; the mode
    is then set explicitly because the umask may have stripped bits from it.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if not hasattr(os, "fchmod"):
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def generate_self_signed(
    cert_dir: Path,
    hostnames: Sequence[str] = (),
    days_valid: int = DEFAULT_DAYS_VALID,
    key_size_bits: int = 2048,
    *,
    overwrite: bool = True,
) -> tuple[Path, Path]:
    """Create ``cert.pem`` and ``key.pem`` in *cert_dir* and return their paths.

    ``localhost``, ``127.0.0.1`` and ``::1`` are always included so the
    certificate works for local development regardless of the extra names.

    Raises ``ValueError`` for invalid names/days/key size (before anything is
    written) and ``FileExistsError`` when *overwrite* is false and either file
    already exists, so an existing key that clients already trust is not lost
    by accident.
    """
    if isinstance(days_valid, bool) or not 1 <= days_valid <= MAX_DAYS:
        raise ValueError(f"days_valid must be between 1 and {MAX_DAYS}, got {days_valid}")
    if key_size_bits < MIN_KEY_SIZE_BITS:
        raise ValueError(
            f"key_size_bits must be at least {MIN_KEY_SIZE_BITS} (clients reject smaller RSA keys), got {key_size_bits}"
        )
    sans = _collect_sans(hostnames)

    cert_dir = Path(cert_dir)
    cert_path = cert_dir / CERT_FILENAME
    key_path = cert_dir / KEY_FILENAME
    if not overwrite:
        existing = [p for p in (cert_path, key_path) if os.path.lexists(p)]
        if existing:
            raise FileExistsError(
                "refusing to overwrite existing " + ", ".join(str(p) for p in existing) + " (use --force to replace)"
            )

    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size_bits)

    cn_source = hostnames[0] if hostnames else "localhost"
    common_name = str(parse_hostname(cn_source))
    if len(common_name) > _MAX_CN_LENGTH:
        # Clients match on the SAN only; the CN is informational, so fall back.
        common_name = "localhost"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    now = datetime.datetime.now(datetime.UTC)
    public_key = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days_valid))
        .add_extension(
            x509.SubjectAlternativeName([_general_name(v) for v in sans]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(public_key),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )

    key_pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)

    cert_dir.mkdir(parents=True, exist_ok=True)
    # Key first: a crash in between leaves a new key with the old cert, which
    # fails loudly at startup rather than silently serving a stale pair.
    _write_atomically(key_path, key_pem, KEY_FILE_MODE)
    _write_atomically(cert_path, cert_pem, CERT_FILE_MODE)
    return cert_path, key_path


def _days_arg(text: str) -> int:
    """Reject bad --days values at parse time so argparse reports them uniformly."""
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of days, got {text!r}") from None
    if not 1 <= days <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_DAYS}, got {days}")
    return days


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gen_cert.py",
        description=(
            "Generate a self-signed TLS certificate (RSA 2048, SHA-256) for the "
            "speech server. localhost, 127.0.0.1 and ::1 are always included."
        ),
    )
    parser.add_argument(
        "hostnames",
        nargs="*",
        metavar="hostname",
        help="extra DNS name or IP address to include (the first one becomes the CN)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_CERT_DIR,
        help=f"output directory (default: {DEFAULT_CERT_DIR})",
    )
    parser.add_argument(
        "--days",
        type=_days_arg,
        default=DEFAULT_DAYS_VALID,
        help=f"validity in days (default: {DEFAULT_DAYS_VALID}; Apple clients reject more than {MAX_ACCEPTED_DAYS})",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing cert.pem/key.pem")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    hostnames: list[str] = args.hostnames
    days: int = args.days
    cert_dir: Path = args.dir

    # Validate up front so usage errors exit 2 (argparse convention) and are
    # never confused with filesystem failures (exit 1).
    try:
        sans = _collect_sans(hostnames)
    except ValueError as exc:
        parser.error(str(exc))

    if days > MAX_ACCEPTED_DAYS:
        print(
            f"warning: {days} days exceeds {MAX_ACCEPTED_DAYS}; Apple clients will reject this certificate",
            file=sys.stderr,
        )

    try:
        cert_path, key_path = generate_self_signed(cert_dir, hostnames, days_valid=days, overwrite=args.force)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write certificate files: {exc}", file=sys.stderr)
        return 1

    print(f"certificate: {cert_path}")
    print(f"private key: {key_path}")
    print(f"valid for:   {days} days")
    print("SANs:        " + ", ".join(f"DNS:{v}" if isinstance(v, str) else f"IP:{v}" for v in sans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
